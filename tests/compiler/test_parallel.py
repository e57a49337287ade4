"""Parallel CPU kernels are race-free: the forward and backward graphs of
BatchNorm2d + ReLU (and BatchNorm2d + ReLU + residual add), big enough that
their kernels run `#pragma omp parallel for`, give bitwise-identical
results on every one of many runs on the same inputs (OMP_NUM_THREADS 2
and 4, set by the parametrized subprocess) and match eager.

Why: a kernel whose parallel loop lets one thread read what another
writes (a [C] statistic computed and consumed in one kernel, several
threads accumulating into one output) gives wrong values only now and
then; comparing many runs bitwise catches what one comparison misses.
A shared accumulator injected into the emitter's reductions fails this
test at once. (Written for tests/python's ResNet flake, which is not a
race: see the commit that added this file.)
"""
import os
import subprocess
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import tcckern as tk  # noqa: E402
from test_fusion import aot_graphs  # noqa: E402

SEED = int(os.environ.get("TCC_TEST_SEED", time.time_ns() % (1 << 31)))
RUNS = int(os.environ.get("TCC_STRESS_RUNS", "60"))
N, C, H, W = (int(v) for v in os.environ.get("TCC_STRESS_SHAPE", "8,64,32,32").split(","))


class BnRelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(C)

    def forward(self, x):
        return torch.relu(self.bn(x))


class BnReluAdd(torch.nn.Module):   # the residual half of a ResNet block
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm2d(C)

    def forward(self, x):
        return torch.relu(x + torch.relu(self.bn(x)))


MODELS = {"bn_relu": BnRelu, "bn_relu_add": BnReluAdd}


def stress(name):
    """Compiles every graph of MODELS[name] and runs each RUNS times."""
    torch.manual_seed(SEED)
    model = MODELS[name]()
    with torch.no_grad():   # non-trivial affine parameters
        model.bn.weight.uniform_(0.5, 1.5)
        model.bn.bias.uniform_(-0.5, 0.5)
    x = (torch.randn(N, C, H, W) * 2 + 0.3).requires_grad_(True)   # grad_input too
    graphs = aot_graphs(model, [x], True)
    assert len(graphs) == 2   # forward and backward
    nparallel = 0
    for gi, (gm, args) in enumerate(graphs):
        tens = [a for a in args if isinstance(a, torch.Tensor)]
        assert len(tens) == len(args)
        for t in tens:   # fresh random values for every input (no zeros)
            if t.is_floating_point() and t.numel() > C:
                t.copy_(torch.randn(t.shape, dtype=torch.float64).to(t.dtype))
        clean, keep = tk.sanitize(gm)
        k = tk.compile_fx(clean, tens, keep_source=True)
        nparallel += k.source.count("omp parallel for")
        want = gm(*[t.clone() for t in tens])
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        want = [want[i] for i in keep]
        # float64 reference of the same graph
        ref = gm(*[t.double() if t.is_floating_point() else t for t in tens])
        ref = list(ref) if isinstance(ref, (tuple, list)) else [ref]
        ref = [ref[i] for i in keep]
        first = [o.clone() for o in k(*tens)]
        for o, w, r in zip(first, want, ref):
            if not o.is_floating_point():
                assert torch.equal(o, w)
                continue
            # within float32 noise of the float64 reference, as eager is
            # (a different summation order: a few times eager's error, and
            # float32 rounding of sums of N*H*W terms of the output's scale)
            scale = max(1.0, r.abs().max().item())
            tol = 4 * (w.double() - r).abs().max().item() + 1e-5 * scale
            err = (o.double() - r).abs().max().item()
            assert err <= tol, f"{name} graph {gi}: {err} from float64 (tolerance {tol})"
        outs = k.alloc_outputs()
        for run in range(RUNS):
            for o in outs:
                o.fill_(float("nan") if o.is_floating_point() else 0)
            k(*tens, outs=outs)
            for j, (o, f) in enumerate(zip(outs, first)):
                if not torch.equal(o, f):
                    diff = (o.double() - f.double()).abs().max().item() if o.is_floating_point() else -1
                    raise AssertionError(f"{name} graph {gi} output {j}: run {run + 1} differs "
                                         f"from run 0 by {diff} (OMP_NUM_THREADS="
                                         f"{os.environ.get('OMP_NUM_THREADS')}, seed {SEED})")
    assert nparallel > 0, "inputs too small to exercise the parallel path"
    return nparallel


@pytest.mark.parametrize("threads", [2, 4])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_parallel_kernels_deterministic(name, threads):
    # OpenMP reads OMP_NUM_THREADS when the runtime starts: a child process
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), TCC_TEST_SEED=str(SEED))
    r = subprocess.run([sys.executable, __file__, name], env=env, capture_output=True, text=True)
    print(r.stdout, r.stderr)
    assert r.returncode == 0, r.stdout + r.stderr


if __name__ == "__main__":
    print(f"test_parallel: seed {SEED} (TCC_TEST_SEED={SEED} replays), "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}")
    print(f"{sys.argv[1]}: {stress(sys.argv[1])} parallel loops, {RUNS} runs each, identical")


HOST_ISA = __import__("tccd.config", fromlist=["x"]).host_cpu_isa()


@pytest.mark.parametrize("rows,n,k,layout", [(9, 3072, 768, "nk"), (9, 770, 3000, "nk"), (1, 2050, 1000, "nk"),
                                             (1, 3072, 768, "kn"), (8, 770, 1001, "kn"),
                                             (32, 2304, 768, "kn"), (17, 500, 1000, "kn")])
def test_few_row_gemm_shares_chunks_with_the_helper_thread(rows, n, k, layout, monkeypatch):
    """On the calling thread alone (the thread governor's mode on a busy
    machine; TCC_ONE_THREAD=1 forces it), a streamed GEMM shares its
    chunks with the artifact's helper thread (compiler/cpu/share.c), which
    the scheduler may preempt with a chunk half done: the caller takes
    such chunks back and never waits for it. Weights stored [N, K]
    (nn.Linear's, streamed by rows: k in one pass, k in chunks (rows over
    32 KB), one row with N past the last whole group and a k tail) and
    [K, N] (GPT-2's Conv1D, split along k: each thread's committed
    chunks summed apart, the sums stored at the job's end; a k tail past
    the last pass; 9-32 rows on AVX-512, split-K tiled: a chunk is runs
    of 48 of C's columns over all of K, the last one with N's tail, and
    k's past the last pass). See check_helper for what is checked."""
    if layout == "kn" and rows > 8 and HOST_ISA != "x86-64-v4":
        pytest.skip("9-32 rows against [K, N] run the split-K-tiled GEMM on AVX-512 alone")
    check_shared_gemm(rows, n, k, layout, monkeypatch)


@pytest.mark.parametrize("rows,n,k,layout", [(300, 700, 300, "nk"), (270, 1100, 250, "kn"),
                                             (600, 600, 200, "t"), (100, 130, 120, "bmm")])
def test_onednn_gemm_shares_blocks_with_the_helper_thread(rows, n, k, layout, monkeypatch):
    """oneDNN's GEMMs (many rows: BERT-base at 8 x 128 tokens) share
    blocks of C with the helper thread as the streamed ones share their
    chunks: each block a one-thread dnnl_sgemm, the helper's into a tile
    it stores when it wins the block, the caller's straight into C.
    Weights [N, K] and [K, N], A transposed (a weight gradient's
    operand), and a batch whose entries are the blocks; row and column
    tails. See check_helper for what is checked."""
    check_shared_gemm(rows, n, k, layout, monkeypatch)


@pytest.mark.parametrize("case", ["nchw", "nhwc", "depthwise", "concat", "backward-data"])
def test_onednn_conv_shares_images_with_the_helper_thread(case, monkeypatch):
    """On the calling thread alone, a oneDNN convolution (forward or
    backward data) shares the images of its minibatch with the helper
    thread (compiler/runtime/onednn_conv.c): each image a primitive made
    for one, the weights reordered once before the job, the helper's
    result into a copy of its own reordered into place when it wins the
    image. Activations NCHW (reorders in and out of oneDNN's blocked
    layout) and channels last (none: the helper's commit is a copy), a
    depthwise convolution with stride 2, a result stored into its slice
    of a concatenation, and the gradient of the input. See check_helper
    for what is checked."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the governor runs every call on the calling thread, without the helper")
    A = torch.ops.aten
    monkeypatch.setenv("TCC_ONE_THREAD", "1")
    g = torch.Generator().manual_seed((SEED ^ hash(case)) & 0xffffffff)
    n, cin, cout, hw, k, stride, groups = {"nchw": (8, 32, 48, 20, 3, 1, 1), "nhwc": (8, 64, 96, 28, 1, 2, 1),
                                           "depthwise": (8, 64, 64, 56, 3, 2, 64),
                                           "concat": (6, 24, 40, 24, 3, 1, 1),
                                           "backward-data": (8, 48, 32, 20, 3, 1, 1)}[case]
    pad = k // 2
    out_hw = (hw + 2 * pad - k) // stride + 1
    w = (torch.rand(cout, cin // groups, k, k, generator=g) * 2 - 1) / (cin // groups * k * k) ** 0.5
    b = torch.rand(cout, generator=g) * 2 - 1
    geometry = ([stride, stride], [pad, pad], [1, 1], False, [0, 0], groups)
    if case == "backward-data":
        xshape, x_in = (n, cout, out_hw, out_hw), torch.rand(n, cin, hw, hw, generator=g)
        rest = (x_in, w)

        def f(gy, x, w):
            return A.convolution_backward.default(gy, x, w, [cout], *geometry, [True, True, True])[0]
    else:
        xshape, rest = (n, cin, hw, hw), (w, b)

        def f(x, w, b):
            y = A.convolution.default(x, w, b, *geometry)
            if case == "concat":
                return A.relu.default(A.cat.default([y, A.mul.Tensor(x, 2.0)], 1))
            return A.relu.default(y)

    def draw(gen):
        x = torch.rand(xshape, generator=gen) * 2 - 1
        return x.contiguous(memory_format=torch.channels_last) if case == "nhwc" else x
    x = draw(g)
    gm = tk.aten_graph(f, [x, *rest], decompose=False)
    kern = tk.compile_fx(gm, [x, *rest], isa=HOST_ISA if HOST_ISA in ("x86-64-v3", "x86-64-v4") else "x86-64-v3",
                         keep_source=True)
    if "tcc_dnnl_conv_run(&k" not in kern.source:
        pytest.skip("oneDNN is not on this build's road (TCC_NO_ONEDNN, or built without it)")
    assert "#define TCC_SHARE 1" in kern.source
    check_helper(kern, f, draw, rest, g, 1e-4)


def check_shared_gemm(rows, n, k, layout, monkeypatch):
    """Every call's output matches float64 on fresh inputs (check_helper);
    layouts: "nk" x . w^T + b, "kn" x . w + b, "t" x^T . w + b (x stored
    [k, rows]), "bmm" x[i] . w[i] + b for 3 entries; GELU after."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the governor runs every call on the calling thread, without the helper")
    A = torch.ops.aten
    monkeypatch.setenv("TCC_ONE_THREAD", "1")
    g = torch.Generator().manual_seed((SEED ^ hash((rows, n, k, layout))) & 0xffffffff)
    xshape = {"t": (k, rows), "bmm": (3, rows, k)}.get(layout, (rows, k))
    w = torch.rand({"nk": (n, k), "bmm": (3, k, n)}.get(layout, (k, n)), generator=g) * 2 - 1
    b, x = torch.rand(n, generator=g) * 2 - 1, torch.rand(xshape, generator=g) * 2 - 1

    def f(x, w, b):
        if layout == "bmm":
            return A.gelu.default(A.add.Tensor(A.bmm.default(x, w), b))
        return A.gelu.default(A.addmm.default(b, A.t.default(x) if layout == "t" else x,
                                              A.t.default(w) if layout == "nk" else w))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    kern = tk.compile_fx(gm, [x, w, b], isa=HOST_ISA if HOST_ISA in ("x86-64-v3", "x86-64-v4") else "x86-64-v3",
                         keep_source=True)
    if rows > 64 and "onednn/" not in kern.identity:
        pytest.skip("oneDNN is not on this build's road (TCC_NO_ONEDNN, or built without it)")
    assert "tcc_share_run(TCC_SELF, P, TCC_NP," in kern.source
    assert rows <= 64 or "dnnl_sgemm(" in kern.source
    check_helper(kern, f, lambda gen: torch.rand(xshape, generator=gen) * 2 - 1, (w, b), g, 1e-4)


def check_helper(kern, f, draw, rest, g, tol):
    """kern (f's graph, compiled; run in mode 1 by TCC_ONE_THREAD) on
    inputs (x, *rest), x drawn fresh by draw(generator) for each call,
    matches f in float64 (rtol and atol tol): quiet, while a spinning
    process takes time slices from the threads (chunks taken back), and
    from two threads calling at once; the helper stored chunks, in the
    process and in a forked child (its own helper); unloading the
    artifact stops and joins the helper."""
    import _ctypes
    import ctypes
    counts = (ctypes.c_int64 * 3).in_dll(kern.lib, "tcc_share_counts")
    want_of = lambda xi: f(xi.double(), *(r.double() for r in rest))  # noqa: E731

    def check(calls):
        for _ in range(calls):
            x = draw(g)
            torch.testing.assert_close(kern(x, *rest)[0].double(), want_of(x), rtol=tol, atol=tol)
    check(20)
    for _ in range(200):   # the helper wakes within microseconds on a quiet machine
        if counts[1] > 0:
            break
        check(1)
    assert counts[0] >= 20 and counts[1] > 0, list(counts)
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)
        check(150)
    finally:
        spinner.kill()
        spinner.wait()
    # two threads at once: one holds the helper, the other runs alone
    import threading
    errors = []

    def caller(seed):
        gl = torch.Generator().manual_seed(seed)
        outs, ws = kern.alloc_outputs(), kern.alloc_workspace()
        try:
            for _ in range(40):
                xl = draw(gl)
                torch.testing.assert_close(kern(xl, *rest, outs=outs, ws=ws)[0].double(), want_of(xl),
                                           rtol=tol, atol=tol)
        except Exception as e:   # reported by the test's thread
            errors.append(e)
    threads = [threading.Thread(target=caller, args=(SEED + i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    # a forked child starts a helper of its own; it runs nothing but the
    # kernel (MKL's allocator, which torch's float64 reference calls,
    # can hang in a child forked from a threaded process) and sends its
    # outputs back through a pipe
    xs = [draw(g) for _ in range(30)]
    wants = [want_of(xi) for xi in xs]
    outs, before = kern.alloc_outputs(), counts[1]
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            import signal
            signal.alarm(120)   # a hang fails the test (SIGALRM ends the child) instead of stalling it
            os.close(rfd)
            for xi in xs:
                data = kern(xi, *rest, outs=outs)[0].numpy().tobytes()   # C order by numpy: no torch threads in a child
                while data:
                    data = data[os.write(wfd, data):]
            for _ in range(300):   # until the helper, started in this process, stores a chunk
                if counts[1] > before:
                    break
                kern(xs[0], *rest, outs=outs)
            os.write(wfd, b"H" if counts[1] > before else b"-")
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    with os.fdopen(rfd, "rb") as pipe:
        got = pipe.read()
    assert os.waitpid(pid, 0)[1] == 0, "the forked child's calls failed"
    size = wants[0].numel() * 4
    assert len(got) == len(xs) * size + 1 and got[-1:] == b"H", "the forked child's helper stored nothing"
    for i, want in enumerate(wants):
        out = torch.frombuffer(bytearray(got[i * size:(i + 1) * size]), dtype=torch.float32).reshape(want.shape)
        torch.testing.assert_close(out.double(), want.contiguous(), rtol=tol, atol=tol)
    tasks = len(os.listdir("/proc/self/task"))
    handle = kern.lib._handle
    del counts, kern
    _ctypes.dlclose(handle)
    assert len(os.listdir("/proc/self/task")) == tasks - 1   # the helper joined


def test_gemm_body_from_the_object_cache_shares_with_the_helper(tmp_path, monkeypatch):
    """A GEMM body compiled for one artifact and linked into another from
    the object cache (compiler/cpu/build.c) calls the helper runtime of
    the .so it is linked into: the runtime is defined weak in every
    object and kept global by the cache, so the second artifact's body
    still shares its chunks (a cached object with the runtime made local
    would keep the body on a runtime of its own that no call enables)."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: the governor runs every call on the calling thread, without the helper")
    import ctypes
    A = torch.ops.aten
    monkeypatch.setenv("TCC_ONE_THREAD", "1")
    env = dict(os.environ, TCC_OBJECT_DIR=str(tmp_path / "objects"))
    g = torch.Generator().manual_seed(SEED & 0xffffffff)
    w, b = torch.rand(3072, 768, generator=g) * 2 - 1, torch.rand(3072, generator=g) * 2 - 1
    x = torch.rand(9, 768, generator=g) * 2 - 1
    isa = HOST_ISA if HOST_ISA in ("x86-64-v3", "x86-64-v4") else "x86-64-v3"
    first = tk.compile_fx(tk.aten_graph(lambda x, w, b: A.gelu.default(A.addmm.default(b, x, A.t.default(w))),
                                        [x, w, b], decompose=False), [x, w, b], isa=isa, env=env)
    assert first.bodies_reused == 0

    def f(x, w, b):
        return A.relu.default(A.addmm.default(b, x, A.t.default(w)))
    kern = tk.compile_fx(tk.aten_graph(f, [x, w, b], decompose=False), [x, w, b], isa=isa, env=env)
    assert kern.bodies_reused >= 1   # the GEMM's body, from the first artifact's object
    counts = (ctypes.c_int64 * 3).in_dll(kern.lib, "tcc_share_counts")
    for _ in range(200):
        x.copy_(torch.rand(9, 768, generator=g) * 2 - 1)
        torch.testing.assert_close(kern(x, w, b)[0].double(), f(x.double(), w.double(), b.double()),
                                   rtol=1e-4, atol=1e-4)
        if counts[1] > 0:
            break
    assert counts[0] >= 1 and counts[1] > 0, list(counts)
