"""Run by test_mega_cache.py in a fresh interpreter.

  mega_child.py save BLOB   compiles foo and a training step of the MLP
                            with backend="tccd" (checked against eager),
                            then writes torch.compiler.save_cache_artifacts()'s
                            bytes to BLOB
  mega_child.py load BLOB   torch.compiler.load_cache_artifacts(BLOB's bytes)
                            first, then the same compiles and checks, then
                            save_cache_artifacts() again (not written)

The last line of output is JSON: tccd.stats() (less graphs_detail) and
"mega": the Mega-Cache's artifact keys by type (those saved, or those
loaded), and "mega_again": those the loading process would save."""
import copy
import json
import sys
import time

import torch

from models import MODELS

TOL = dict(rtol=1e-4, atol=1e-5)


def run_models():
    seed = time.time_ns() % (2**31)
    print("seed", seed)
    torch.manual_seed(seed)

    def foo(x, y):
        return torch.sin(x) + torch.cos(y)

    x, y = torch.randn(10, 10), torch.randn(10, 10)
    torch.testing.assert_close(torch.compile(foo, backend="tccd")(x, y), foo(x, y), **TOL)
    make, data, loss_fn = MODELS["mlp"]
    m = make()
    ref = copy.deepcopy(m)
    inp, target = data()
    out, ref_out = torch.compile(m, backend="tccd")(inp), ref(inp)
    torch.testing.assert_close(out, ref_out, **TOL)
    loss_fn(out, target).backward()
    loss_fn(ref_out, target).backward()
    for p, q in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)


def keys(info):
    """A CacheInfo's artifact keys by type."""
    return {kind: list(names) for kind, names in info.artifacts.items()} if info else None


def main(mode, blob):
    again = None
    if mode == "load":
        # torch reads the blob without tccd (its entries are torch's own
        # artifact type); tccd's classes are imported when an entry is used
        assert "tccd" not in sys.modules
        with open(blob, "rb") as f:
            info = torch.compiler.load_cache_artifacts(f.read())
        run_models()
        # what it loaded, it records again (a loading node can pass it on)
        saved = torch.compiler.save_cache_artifacts()
        again = keys(saved[1]) if saved else None
    else:
        run_models()
        saved = torch.compiler.save_cache_artifacts()
        assert saved is not None, "save_cache_artifacts() recorded nothing"
        data, info = saved
        with open(blob, "wb") as f:
            f.write(data)
    import tccd

    s = tccd.stats()
    s.pop("graphs_detail")
    s["mega"], s["mega_again"] = keys(info), again
    print(json.dumps(s))


if __name__ == "__main__":
    main(*sys.argv[1:])
