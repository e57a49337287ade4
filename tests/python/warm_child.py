"""Run by test_warm.py in a fresh interpreter: compiles foo and a training
step of each model with backend="tccd", checks the results against eager,
and prints tccd.stats() as JSON on the last line."""
import copy
import json
import sys
import time

import torch

import tccd
import tccd.plan
from models import MODELS


def main(names):
    torch.manual_seed(time.time_ns() % (2**31))

    def foo(x, y):
        return torch.sin(x) + torch.cos(y)

    x, y = torch.randn(10, 10), torch.randn(10, 10)
    torch.testing.assert_close(torch.compile(foo, backend="tccd")(x, y), foo(x, y),
                               rtol=1e-4, atol=1e-5)
    for name in names:
        make, data, loss_fn = MODELS[name]
        m = make()
        ref = copy.deepcopy(m)
        cm = torch.compile(m, backend="tccd")
        inp, target = data()
        out, ref_out = cm(inp), ref(inp)
        torch.testing.assert_close(out, ref_out, rtol=1e-4, atol=1e-5)
        loss_fn(out, target).backward()
        loss_fn(ref_out, target).backward()
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5)
    tccd.plan.flush(60)                 # plans are sent in the background
    s = tccd.stats()
    s.pop("graphs_detail")
    print(json.dumps(s))


if __name__ == "__main__":
    main(sys.argv[1:])
