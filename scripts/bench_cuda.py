"""bench_cuda: the CUDA kernel benchmark table — PyTorch eager,
torch.compile (Inductor/Triton) and tccd on the same cases and sizes, with
tccd's achieved bandwidth against the measured device-to-device copy
bandwidth.

    python3 scripts/bench_cuda.py TCCD.json [--quick] [--json OUT]

TCCD.json is what build/tests/cuda/bench-cuda printed (tccd's timings,
the device, copy_gbs). The PyTorch columns need a CUDA build of torch;
without one they are null and the table says so ("unmeasured"). Targets
(issue 4): geomean tccd/Inductor <= 1.0; memory-bound kernels >= 80% of
the copy bandwidth.
"""
import argparse
import json
import math
import os
import sys

try:
    import torch
    import torch.nn.functional as F
except ImportError:  # the table still prints tccd's column
    torch = None


def cases(quick):
    """name -> (make inputs on device, function): mirrors bench_cuda.c."""
    R = C = 1024 if quick else 4096
    f32, f16 = torch.float32, torch.float16

    def rnd(*shape, dtype=f32):
        return torch.rand(*shape, device="cuda", dtype=dtype) - 0.5

    def ln(x, w, b):
        return F.layer_norm(x, (1024,), w, b, 1e-5)

    n24 = 1 << 20 if quick else 1 << 24
    return {
        "add_relu": (lambda: (rnd(R, C), rnd(R, C)), lambda x, y: torch.relu(x + y)),
        "add_relu_f16": (lambda: (rnd(R, C, dtype=f16), rnd(R, C, dtype=f16)), lambda x, y: torch.relu(x + y)),
        "sin_cos": (lambda: (rnd(R, C), rnd(C)), lambda x, y: torch.sin(x) + torch.cos(y)),
        "softmax": (lambda: (rnd(2 * R, 1024),), lambda x: torch.softmax(x, 1)),
        "log_softmax": (lambda: (rnd(2 * R, 1024),), lambda x: torch.log_softmax(x, 1)),
        "layer_norm": (lambda: (rnd(2 * R, 1024), rnd(1024), rnd(1024)), ln),
        "sum_rows": (lambda: (rnd(R, C),), lambda x: x.sum(1)),
        "sum_all": (lambda: (rnd(n24),), lambda x: x.sum()),
        "gelu_mlp": (lambda: (rnd(512, 768), rnd(3072, 768), rnd(3072)), lambda x, w, b: F.gelu(F.linear(x, w, b))),
    }


def time_ms(fn, args, target_ms=50.0):
    """Median of 5 rounds of the mean time of a batch (CUDA events)."""
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn(*args)
    end.record()
    torch.cuda.synchronize()
    one = max(start.elapsed_time(end), 1e-3)
    batch = max(3, min(5000, int(target_ms / one)))
    rounds = []
    for _ in range(5):
        start.record()
        for _ in range(batch):
            fn(*args)
        end.record()
        torch.cuda.synchronize()
        rounds.append(start.elapsed_time(end) / batch)
    return sorted(rounds)[2]


def torch_columns(names, quick):
    """{name: (eager_ms, inductor_ms)}; {} without CUDA torch."""
    if torch is None or not torch.cuda.is_available():
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False   # what tccd does (float32 GEMMs without TF32)
    out = {}
    defs = cases(quick)
    for name in names:
        if name not in defs:
            continue
        make, fn = defs[name]
        args = make()
        eager = time_ms(fn, args)
        try:
            compiled = torch.compile(fn, backend="inductor")
            inductor = time_ms(compiled, args)
        except Exception as e:  # noqa: BLE001 - report, keep the other columns
            print(f"bench_cuda: torch.compile failed on {name}: {e}", file=sys.stderr)
            inductor = None
        out[name] = (eager, inductor)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tccd_json")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", help="write the merged table here")
    a = ap.parse_args(argv)
    with open(a.tccd_json) as f:
        t = json.load(f)
    cols = torch_columns([c["name"] for c in t["cases"]], a.quick)
    why = None if cols else ("no torch" if torch is None else "torch has no CUDA device")
    rows, ratios = [], []
    for c in t["cases"]:
        eager, ind = cols.get(c["name"], (None, None))
        r = dict(c, eager_ms=eager, inductor_ms=ind)
        if ind:
            r["tccd_over_inductor"] = c["tccd_ms"] / ind
            ratios.append(r["tccd_over_inductor"])
        rows.append(r)
    doc = {
        "device": t.get("device"), "arch": t.get("arch"), "copy_gbs": t.get("copy_gbs"),
        "torch": None if torch is None else torch.__version__, "torch_columns": why or "measured",
        "geomean_tccd_over_inductor": math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else None,
        "memory_bound_min_pct_of_copy": min((c["pct_of_copy"] for c in t["cases"] if c["kind"] != "matmul"),
                                            default=None),
        "cases": rows,
    }
    fmt = lambda v, f="%.4f": "-" if v is None else f % v  # noqa: E731
    print(f"device {doc['device']} ({doc['arch']}), copy {doc['copy_gbs']} GB/s; PyTorch columns: "
          f"{doc['torch_columns']}")
    print(f"{'case':14} {'eager ms':>10} {'inductor ms':>12} {'tccd ms':>10} {'tccd GB/s':>10} {'% copy':>7} {'steps':>5}")
    for r in rows:
        print(f"{r['name']:14} {fmt(r['eager_ms']):>10} {fmt(r['inductor_ms']):>12} {fmt(r['tccd_ms']):>10} "
              f"{r['gbs']:>10.1f} {r['pct_of_copy']:>7.1f} {r['steps']:>5}")
    print(f"geomean tccd/Inductor: {fmt(doc['geomean_tccd_over_inductor'], '%.3f')} (target <= 1.0); "
          f"lowest memory-bound % of copy: {fmt(doc['memory_bound_min_pct_of_copy'], '%.1f')} (target >= 80)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
