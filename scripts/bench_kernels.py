"""bench-kernels: per-case timings of PyTorch eager, torch.compile
(Inductor), tccd fused and tccd with fusion off (TCC_NO_FUSION: each op
its own kernel), on the same inputs in one run; achieved GB/s of the tccd
kernel against a STREAM triad measured here (a small OpenMP C kernel);
cold compile time of tccd (the library's tcc_compile: lower, fuse, emit,
cc) vs Inductor (first call with its caches disabled).

tccd kernels are compiled without the daemon by the build's
tcc-compile-file from the graph the PyTorch client would send (make_fx
with core ATen decompositions -> tccd.graph.build_graph) and called
through ctypes.
"""
import argparse
import ctypes
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
# PyTorch's ops, Inductor's kernels and tccd's share one OpenMP runtime
# (the libgomp.so.1 torch loads), left at its default wait policy as in a
# model's process: idle threads spin a while, then sleep. Passive waits
# (OMP_WAIT_POLICY=PASSIVE in the environment) wake threads through the
# kernel at every parallel region, tens of microseconds a region on a VM
# (docs/benchmarks.md#cpu-gemms).
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

ROOT = os.environ.get("TCC_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..")))
sys.path.insert(0, os.path.join(ROOT, "tests", "compiler"))
import tcckern as tk  # noqa: E402
from tccd.config import host_cpu_isa  # noqa: E402

# the target the PyTorch client asks for on this machine (tcckern's default,
# x86-64-v3, is the tests' fixed one)
ISA = host_cpu_isa() or "x86-64-v2"

A = torch.ops.aten


# ------------------------------------------------------------ STREAM

TRIAD_C = r"""
#include <stdint.h>
void triad(double *a, const double *b, const double *c, double s, int64_t n) {
  #pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
}
"""


def stream_triad_gbs(n=1 << 24, reps=10):
    d = tempfile.mkdtemp(prefix="bench-triad-")
    src, so = os.path.join(d, "t.c"), os.path.join(d, "t.so")
    with open(src, "w") as f:
        f.write(TRIAD_C)
    subprocess.run(["cc", "-O3", "-march=native", "-fopenmp", "-fPIC", "-shared", "-o", so, src], check=True)
    lib = ctypes.CDLL(so)
    lib.triad.argtypes = [ctypes.c_void_p] * 3 + [ctypes.c_double, ctypes.c_int64]
    a, b, c = (torch.rand(n, dtype=torch.float64) for _ in range(3))
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        lib.triad(a.data_ptr(), b.data_ptr(), c.data_ptr(), 3.0, n)
        best = min(best, time.perf_counter() - t0)
    return 3 * 8 * n / best / 1e9


# ------------------------------------------------------------- cases

def case(name, fn, make_inputs, memory_bound=True, module=None):
    return {"name": name, "fn": fn, "inputs": make_inputs, "memory_bound": memory_bound, "module": module}


class MLPBlock(torch.nn.Module):
    def __init__(self, d=512, h=2048):
        super().__init__()
        self.l1, self.l2, self.ln = torch.nn.Linear(d, h), torch.nn.Linear(h, d), torch.nn.LayerNorm(d)

    def forward(self, x):
        return self.ln(x + self.l2(F.gelu(self.l1(x))))


class ResNetBlock(torch.nn.Module):
    """ResNet's basic block (conv3x3-bn-relu-conv3x3-bn + identity, relu),
    eval mode: convolutions are tccd extern steps (im2col + sgemm) with
    batch norm, the residual add and relu fused into their epilogues."""

    def __init__(self, c=64):
        super().__init__()
        self.c1 = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.b1 = torch.nn.BatchNorm2d(c)
        self.c2 = torch.nn.Conv2d(c, c, 3, 1, 1, bias=False)
        self.b2 = torch.nn.BatchNorm2d(c)
        for b in (self.b1, self.b2):   # non-trivial running statistics
            b.running_mean.uniform_(-0.5, 0.5)
            b.running_var.uniform_(0.5, 1.5)

    def forward(self, x):
        return F.relu(x + self.b2(self.c2(F.relu(self.b1(self.c1(x))))))


def cases(quick):
    R, C = (256, 1024) if quick else (1024, 4096)
    ln_w, ln_b = torch.randn(C), torch.randn(C)
    out = [
        case("sin_cos", lambda x, y: torch.sin(x) + torch.cos(y), lambda: [torch.randn(R, C), torch.randn(R, C)]),
        case("gelu", lambda x: F.gelu(x), lambda: [torch.randn(R, C)]),
        case("softmax", lambda x: torch.softmax(x, -1), lambda: [torch.randn(R, C)]),
        case("log_softmax", lambda x: torch.log_softmax(x, -1), lambda: [torch.randn(R, C)]),
        case("layer_norm", lambda x, w, b: F.layer_norm(x, [C], w, b), lambda: [torch.randn(R, C), ln_w, ln_b]),
        case("rms_norm", lambda x, w: F.rms_norm(x, [C], w, 1e-6), lambda: [torch.randn(R, C), ln_w]),
        case("linear_bias_gelu", lambda x, w, b: F.gelu(F.linear(x, w, b)),
             lambda: [torch.randn(512, 768), torch.randn(3072, 768) * 0.03, torch.randn(3072)], memory_bound=False),
        case("residual_layer_norm", lambda x, y, w, b: F.layer_norm(x + y, [C], w, b),
             lambda: [torch.randn(R, C), torch.randn(R, C), ln_w, ln_b]),
        case("masked_attn_softmax",
             lambda s, m: torch.softmax((s * 0.125).masked_fill(~m, float("-inf")), -1),
             lambda: [torch.randn(8, 8, 256, 256), torch.rand(256, 256) > 0.2]),
        case("var_mean", lambda x: torch.var_mean(x, -1), lambda: [torch.randn(R, C)]),
        case("mlp_block", None, lambda: [torch.randn(4, 128, 512)], memory_bound=False, module=MLPBlock),
        case("transformer_encoder", None, lambda: [torch.randn(4, 128, 256)], memory_bound=False,
             module=lambda: torch.nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)),
        case("resnet_block", None, lambda: [torch.randn(2 if quick else 8, 64, 32, 32)],
             memory_bound=False, module=ResNetBlock),
    ]
    return out


# ----------------------------------------------------------- helpers

ROUNDS = 5

def timeit(f, reps, warmup=2):
    for _ in range(warmup):
        f()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        f()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def aot_forward_graph(module, inputs):
    """The forward ATen graph AOTAutograd (core ATen decompositions) makes
    for an eval-mode module, and the arguments it is called with."""
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch.nn.attention import SDPBackend, sdpa_kernel
    got = []

    def comp(gm, ex):
        def run(args):
            got.append((gm, list(args)))
            return gm(*args)
        run._boxed_call = True
        return run

    def backend(gm, ex):
        return aot_module_simplified(gm, ex, fw_compiler=comp, decompositions=core_aten_decompositions())
    torch._dynamo.reset()
    torch.backends.mha.set_fastpath_enabled(False)   # no fused _transformer_encoder_layer_fwd
    with torch.no_grad(), sdpa_kernel([SDPBackend.MATH]):
        torch.compile(module, backend=backend)(*inputs)
    torch._dynamo.reset()
    return got[0]


def tensor_bytes(ts):
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def run_case(c, reps):
    torch.manual_seed(0)
    inputs = c["inputs"]()
    res = {"name": c["name"]}
    if c["module"]:
        torch.backends.mha.set_fastpath_enabled(False)
        mod = c["module"]().eval()
        eager = lambda: mod(*inputs)  # noqa: E731
        gm, args = aot_forward_graph(mod, inputs)
        inductor_target = mod
    else:
        fn = c["fn"]
        eager = lambda: fn(*inputs)  # noqa: E731

        class Wrap(torch.nn.Module):
            def forward(self, *xs):
                return fn(*xs)
        gm, args = aot_forward_graph(Wrap(), inputs)   # what torch.compile would send
        inductor_target = fn
    with torch.no_grad():
        want = eager()
        # Inductor: cold compile = first call with caches off
        torch._dynamo.reset()
        comp = torch.compile(inductor_target)
        t0 = time.perf_counter()
        comp(*inputs)
        res["inductor_compile_s"] = time.perf_counter() - t0
    clean, keep = tk.sanitize(gm)
    tens = [a for a in args if isinstance(a, torch.Tensor)]
    t0 = time.perf_counter()
    k = tk.compile_fx(clean, tens, isa=ISA)
    res["tccd_compile_s"] = time.perf_counter() - t0
    res["tccd_compile_ms_library"] = k.compile_ms
    res["tccd_kernels"] = k.kernels
    res["tccd_kinds"] = k.kinds
    outs = k.alloc_outputs()
    got = k(*tens, outs=outs)
    w = want if isinstance(want, (tuple, list)) else [want]
    w0 = [t for t in w if isinstance(t, torch.Tensor)][0]
    res["max_abs_err"] = float((got[0].float() - w0.float()).abs().max())
    env = dict(os.environ, TCC_NO_FUSION="1")
    k2 = tk.compile_fx(clean, tens, isa=ISA, env=env)
    outs2 = k2.alloc_outputs()
    res["tccd_nofusion_kernels"] = k2.kernels
    # Interleaved rounds, the median of each round's median per column:
    # this VM's speed drifts by up to 2x within a run, and timing one
    # column after the other put the drift into the comparison.
    cols = {"eager_ms": eager, "inductor_ms": lambda: comp(*inputs),
            "tccd_ms": lambda: k(*tens, outs=outs), "tccd_nofusion_ms": lambda: k2(*tens, outs=outs2)}
    per_round = {col: [] for col in cols}
    with torch.no_grad():
        for f in cols.values():      # warm-up, past tccd's thread governor's first choice
            timeit(f, 6, warmup=0)
        for _ in range(ROUNDS):
            for col, f in cols.items():
                per_round[col].append(timeit(f, max(reps // ROUNDS, 3), warmup=1))
    torch._dynamo.reset()
    for col, v in per_round.items():
        res[col] = statistics.median(v)
        res[col.replace("_ms", "_rounds_ms")] = v
    moved = tensor_bytes(tens) + tensor_bytes(outs)
    res["bytes"] = moved
    res["tccd_gbs"] = moved / (res["tccd_ms"] / 1e3) / 1e9
    res["memory_bound"] = c["memory_bound"]
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--quick", action="store_true", help="small shapes, few repetitions")
    ap.add_argument("--cases", help="comma-separated subset")
    ap.add_argument("--reps", type=int, default=0)
    a = ap.parse_args()
    reps = a.reps or (10 if a.quick else 50)
    triad = stream_triad_gbs(1 << (22 if a.quick else 25))
    print(f"STREAM triad: {triad:.1f} GB/s   torch {torch.__version__}, {torch.get_num_threads()} threads, "
          f"tccd target cpu:{ISA}, OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'default')}")
    results = []
    for c in cases(a.quick):
        if a.cases and c["name"] not in a.cases.split(","):
            continue
        try:
            r = run_case(c, reps)
        except Exception as e:   # a case that cannot run is reported, not fatal
            r = {"name": c["name"], "error": f"{type(e).__name__}: {e}"[:300]}
        results.append(r)
        print_row(r, triad, header=len(results) == 1)
        sys.stdout.flush()
    ok = [r for r in results if "error" not in r]
    geo = math.exp(sum(math.log(r["inductor_ms"] / r["tccd_ms"]) for r in ok) / len(ok)) if ok else None
    geo_e = math.exp(sum(math.log(r["eager_ms"] / r["tccd_ms"]) for r in ok) / len(ok)) if ok else None
    if ok:
        print(f"\ngeomean speedup of tccd (fused) vs Inductor: {geo:.2f}x   vs eager: {geo_e:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"stream_triad_gbs": triad, "tccd_target": f"cpu:{ISA}",
                       "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY", "default"), "cases": results,
                       "summary": {"geomean_vs_inductor": geo, "geomean_vs_eager": geo_e,
                                   "cases": len(results), "failed": len(results) - len(ok)}}, f, indent=1)


def print_row(r, triad, header):
    if header:
        print(f"{'case':22} {'eager ms':>9} {'inductor':>9} {'tccd':>9} {'no-fuse':>9} {'kern':>5} "
              f"{'GB/s':>7} {'%triad':>7} {'tccd cc s':>9} {'ind cc s':>9}")
    if "error" in r:
        print(f"{r['name']:22} ERROR {r['error']}")
        return
    pct = f"{100 * r['tccd_gbs'] / triad:6.0f}%" if r["memory_bound"] else "     - "
    gbs = f"{r['tccd_gbs']:7.1f}" if r["memory_bound"] else "      -"
    print(f"{r['name']:22} {r['eager_ms']:9.3f} {r['inductor_ms']:9.3f} {r['tccd_ms']:9.3f} "
          f"{r['tccd_nofusion_ms']:9.3f} {r['tccd_kernels']:>2}/{r['tccd_nofusion_kernels']:<2} {gbs} {pct} "
          f"{r['tccd_compile_s']:9.2f} {r['inductor_compile_s']:9.2f}")


if __name__ == "__main__":
    main()
