"""
The daemon's object cache of CPU kernel bodies (issue 22 item 2): a
second artifact with the same bodies -- here the same graphs under
another guard key (mode reduce-overhead) -- links them from the objects
the first compile stored instead of compiling them, computes the same
(tcc-run against the first artifact's outputs on fresh random inputs),
and Stats counts the bodies lent (object_hits) and compiled
(object_misses); --object-cache-max-bytes 0 turns it off.
"""
import json
import os
import subprocess

import numpy as np

from conftest import GRAPHS, TCC_RUN

NAMES = ["gelu_mlp.json", "layer_norm.json", "softmax.json"]


def as_mode(tmp_path, name, mode):
    req = json.load(open(os.path.join(GRAPHS, name)))
    req["options"] = {"mode": mode}
    p = tmp_path / f"{mode}-{name}"
    p.write_text(json.dumps(req))
    return str(p)


def run_kernel(d, path, tmp_path, tag):
    """Runs the request's kernel through tcc-run on inputs written from
    the request's input sizes (float32, fresh random); returns the
    outputs' bytes."""
    req = json.load(open(path))
    metas = {v["name"]: v["meta"] for v in req["graph"]["values"]}
    ins = []
    for k, name in enumerate(req["graph"]["inputs"]):
        m = metas[name]
        n = 1
        for s in m["sizes"]:
            n *= int(s)
        f = tmp_path / f"in{k}.bin"
        if not f.exists():
            f.write_bytes(np.random.default_rng().standard_normal(n).astype(np.float32).tobytes())
        ins.append(str(f))
    outs = [str(tmp_path / f"{tag}-out{k}.bin") for k in range(len(req["graph"]["outputs"]))]
    p = subprocess.run([TCC_RUN, d.addr, path, *ins, "--", *outs], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    return [open(o, "rb").read() for o in outs]


def test_second_artifact_links_cached_bodies(daemon_factory, tmp_path):
    d = daemon_factory().start()
    for n in NAMES:
        d.tcctl("compile", os.path.join(GRAPHS, n))
    first = d.stats()
    assert first.get("object_hits", 0) == 0 and first["object_misses"] >= len(NAMES), first
    objects = os.path.join(d.cache_dir, "objects")
    assert any(f.endswith(".o") for f in os.listdir(objects))

    for n in NAMES:
        r = d.tcctl("compile", as_mode(tmp_path, n, "REDUCE_OVERHEAD"))
        assert r["cache"] == "miss"
    second = d.stats()
    assert second["object_hits"] == first["object_misses"], second   # every body lent
    assert second["object_misses"] == first["object_misses"]         # none compiled again
    human = d.tcctl("stats", json_out=False)
    assert f"{second['object_hits']} of {2 * first['object_misses']} kernel bodies linked from it" in human

    for n in NAMES:  # the linked artifact computes what the first one does, bit for bit
        work = tmp_path / n.replace(".json", "")
        work.mkdir()
        a = run_kernel(d, os.path.join(GRAPHS, n), work, "default")
        b = run_kernel(d, as_mode(tmp_path, n, "REDUCE_OVERHEAD"), work, "ro")
        assert a == b, n


def test_off(daemon_factory):
    d = daemon_factory(extra_args=["--object-cache-max-bytes", "0"]).start()
    for n in NAMES:
        d.tcctl("compile", os.path.join(GRAPHS, n))
    s = d.stats()
    assert s.get("object_hits", 0) == 0 and s.get("object_misses", 0) == 0, s
    assert not os.path.exists(os.path.join(d.cache_dir, "objects"))
