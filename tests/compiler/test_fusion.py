"""The scheduler: what fuses, what does not, and that the fused kernels
still compute PyTorch's results.

- tests/graphs/{softmax,layer_norm,gelu_mlp}.json: 1, 1 and extern + 1
  kernels, checked against eager on fresh random inputs;
- golden scheduler tests: tests/compiler/golden/NAME.json (a
  CompileRequest in protobuf JSON: the IR in) and NAME.groups (the kernel
  grouping out: one line per kernel, "kind: stored values"). Set
  TCC_GOLDEN_UPDATE=1 to rewrite the .groups files;
- sibling reductions share one loop, a reduction is not recomputed per
  element where it cannot be hoisted, temporaries share workspace;
- the inner loop of a pointwise kernel is vectorized (gcc
  -fopt-info-vec-optimized on the generated source);
- whole forward and backward graphs (MLP, transformer encoder layer,
  ResNet-style block without convolution) from AOTAutograd with core
  ATen decompositions compile and match eager.
"""
import glob
import json
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from google.protobuf import json_format

sys.path.insert(0, os.path.dirname(__file__))
import tcckern as tk  # noqa: E402
from tccd._proto import tcc_pb2 as pb  # noqa: E402

A = torch.ops.aten
HERE = os.path.dirname(os.path.abspath(__file__))
GRAPHS = os.path.join(tk.ROOT, "tests", "graphs")
SEED = int(os.environ.get("TCC_TEST_SEED", time.time_ns() % (1 << 31)))
print(f"test_fusion: seed {SEED} (TCC_TEST_SEED={SEED} replays)")
torch.manual_seed(SEED)
# The convolution tests below that look at im2col packs and GEMMs take
# that road (float32 convolutions are oneDNN steps when tccd has oneDNN).
GEMM_ROAD = dict(os.environ, TCC_NO_ONEDNN="1")


def compiled_against_f64(f, ins, tol=1e-4):
    """f's ATen graph compiled (source kept), its outputs on `ins`
    checked against f in float64 (rtol = atol = tol); returns the kernel."""
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    want = f(*[t.double() for t in ins])
    for got, ref in zip(k(*ins), want):
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol)
    return k


def vectorize_report(tmp_path, source):
    """gcc's vectorizer report (-fopt-info-vec-optimized) for generated
    source, built with the flags compiler/cpu/build.c uses."""
    src = tmp_path / "k.c"
    src.write_text(source)
    r = subprocess.run(["cc", "-std=c11", "-O3", "-march=x86-64-v3", "-fopenmp", "-fPIC",
                        "-ffp-contract=off", "-fno-math-errno", "-fno-trapping-math",
                        "-fopt-info-vec-optimized", "-c", str(src), "-o", str(tmp_path / "k.o")],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    return r


def assert_vector_code(tmp_path, source):
    """The kernel bodies of generated source, built as vectorize_report
    builds them, hold packed AVX2 instructions: gcc's report alone has
    said "vectorized" of loops whose object code was only the scalar copy
    (scripts/check-vectorized looks at dumps the same way)."""
    vectorize_report(tmp_path, source)
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(tmp_path / "k.o")],
                         capture_output=True, text=True, check=True).stdout
    bodies = re.split(r"\n(?=[0-9a-f]+ <)", dis)
    body = [b for b in bodies if re.match(r"[0-9a-f]+ <tcc_b[0-9a-f]+[.>]", b)]
    assert body and any("ymm" in b for b in body), re.findall(r"<[^>]+>:", dis)


def load_request(path):
    with open(path) as f:
        return json_format.Parse(f.read(), pb.CompileRequest())


def random_inputs(req):
    metas = {v.name: v.meta for v in req.graph.values}
    out = []
    for name in req.graph.inputs:
        m = metas[name]
        dt = tk.PB_TO_TORCH[m.dtype]
        span = 1 + sum((s - 1) * st for s, st in zip(m.sizes, m.strides)) if all(m.sizes) else 0
        base = torch.randn(m.storage_offset + span, dtype=torch.float64).to(dt)
        out.append(base.as_strided(list(m.sizes), list(m.strides), m.storage_offset))
    return out


def groups(k):
    return k.groups


def test_softmax_graph_is_one_kernel():
    req = load_request(os.path.join(GRAPHS, "softmax.json"))
    k = tk.compile_request(req)
    assert k.kernels == 1 and k.kinds == ["reduction"]
    (x,) = random_inputs(req)
    torch.testing.assert_close(k(x)[0], torch.softmax(x, -1), rtol=1e-5, atol=1e-6)


def test_layer_norm_graph_is_one_kernel():
    req = load_request(os.path.join(GRAPHS, "layer_norm.json"))
    k = tk.compile_request(req)
    assert k.kernels == 1 and k.kinds == ["reduction"]
    x, w, b = random_inputs(req)
    want = torch.nn.functional.layer_norm(x, [x.shape[-1]], w, b, 1e-5)
    torch.testing.assert_close(k(x, w, b)[0], want, rtol=1e-4, atol=1e-4)


def test_gelu_mlp_is_gemm_plus_one_kernel():
    req = load_request(os.path.join(GRAPHS, "gelu_mlp.json"))
    k = tk.compile_request(req)
    assert k.kinds == ["extern", "pointwise"], k.kinds
    x, w, b = random_inputs(req)
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))
    torch.testing.assert_close(k(x, w, b)[0], want, rtol=1e-4, atol=1e-4)


def test_conv_bias_relu_is_pack_gemm_plus_one_kernel():
    """conv + bias + relu: the zero-padded copy of x, the im2col packing
    kernel (plain copies from it: no clamped index, no border mask), the
    GEMM (extern) and ONE epilogue kernel holding bias and relu (nothing
    between); with inference batch norm and a residual add the epilogue is
    still one kernel. A 1x1 conv on a batch of 1 needs no packing: extern + 1."""
    x, w, b = torch.randn(2, 8, 12, 12), torch.randn(16, 8, 3, 3), torch.randn(16)
    def f(x, w, b):
        return A.relu.default(A.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    k = tk.compile_fx(gm, [x, w, b], keep_source=True, env=GEMM_ROAD)
    assert k.kinds == ["pointwise", "pointwise", "extern", "pointwise"], k.kinds
    pack = tk.kernel_text(k.source, "k1: ")
    assert "tcc_min64" not in pack and "?" not in pack, pack
    torch.testing.assert_close(k(x, w, b)[0], f(x, w, b), rtol=1e-4, atol=1e-4)

    rm, rv, g, beta = torch.randn(16), torch.rand(16) + 0.5, torch.randn(16), torch.randn(16)
    res = torch.randn(2, 16, 12, 12)
    def h(x, w, rm, rv, g, beta, res):
        y = A.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        y = A._native_batch_norm_legit_no_training.default(y, g, beta, rm, rv, 0.1, 1e-5)[0]
        return A.relu.default(A.add.Tensor(y, res))
    ins = [x, w, rm, rv, g, beta, res]
    gm = tk.aten_graph(h, ins, decompose=False)
    k = tk.compile_fx(gm, ins, env=GEMM_ROAD)
    assert k.kinds == ["pointwise", "pointwise", "extern", "pointwise"], k.kinds
    torch.testing.assert_close(k(*ins)[0], h(*ins), rtol=1e-4, atol=1e-4)

    x1, w1 = torch.randn(1, 8, 7, 7), torch.randn(4, 8, 1, 1)
    def f1(x, w, b):
        return A.relu.default(A.convolution.default(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
    gm = tk.aten_graph(f1, [x1, w1, b[:4]], decompose=False)
    k = tk.compile_fx(gm, [x1, w1, b[:4].clone()], env=GEMM_ROAD)
    assert k.kinds == ["extern", "pointwise"], k.kinds
    torch.testing.assert_close(k(x1, w1, b[:4].clone())[0], f1(x1, w1, b[:4]), rtol=1e-4, atol=1e-4)


def test_conv_and_gemm_steps_in_one_artifact():
    """A convolution (oneDNN's runtime, dnnl.h) and a float32 GEMM
    (dnnl_sgemm: 16 images, past the rows that stream the weight) in one
    graph, as a CNN's stem and classifier: one source declares both once,
    builds, and matches eager."""
    x, w, b = torch.randn(16, 3, 10, 10), torch.randn(8, 3, 3, 3), torch.randn(8)
    fw, fb = torch.randn(5, 8 * 10 * 10), torch.randn(5)
    def f(x, w, b, fw, fb):
        y = A.relu.default(A.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
        return A.addmm.default(fb, A.view.default(y, [16, 800]), A.t.default(fw))
    gm = tk.aten_graph(f, [x, w, b, fw, fb], decompose=False)
    k = tk.compile_fx(gm, [x, w, b, fw, fb], keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN")
    assert k.source.count("tcc_dnnl_conv_run(&k") == 1 and "dnnl_sgemm(" in k.source
    torch.testing.assert_close(k(x, w, b, fw, fb)[0], f(x, w, b, fw, fb), rtol=1e-4, atol=1e-4)


def test_onednn_conv_step_takes_one_epilogue_kernel():
    """On the oneDNN road a convolution is one extern step that reads its
    input where it is: conv + bias + relu is the step and ONE epilogue
    kernel; inference batch norm and a residual add join that kernel; a
    pointwise producer of the input is one kernel before the step (the
    step reads a buffer, not an expression). Each matches eager."""
    x, w, b = torch.randn(2, 8, 12, 12), torch.randn(16, 8, 3, 3), torch.randn(16)
    def f(x, w, b):
        return A.relu.default(A.convolution.default(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    k = tk.compile_fx(gm, [x, w, b], keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN")
    assert k.kinds == ["extern", "pointwise"], k.kinds
    assert k.source.count("tcc_dnnl_conv_run(&k") == 1 and "cblas_sgemm(" not in k.source
    torch.testing.assert_close(k(x, w, b)[0], f(x, w, b), rtol=1e-4, atol=1e-4)

    rm, rv, g, beta = torch.randn(16), torch.rand(16) + 0.5, torch.randn(16), torch.randn(16)
    res = torch.randn(2, 16, 12, 12)
    def h(x, w, rm, rv, g, beta, res):
        y = A.relu.default(A.mul.Tensor(x, 0.5))
        y = A.convolution.default(y, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        y = A._native_batch_norm_legit_no_training.default(y, g, beta, rm, rv, 0.1, 1e-5)[0]
        return A.relu.default(A.add.Tensor(y, res))
    ins = [x, w, rm, rv, g, beta, res]
    gm = tk.aten_graph(h, ins, decompose=False)
    k = tk.compile_fx(gm, ins)
    assert k.kinds == ["pointwise", "extern", "pointwise"], k.kinds
    torch.testing.assert_close(k(*ins)[0], h(*ins), rtol=1e-4, atol=1e-4)


def test_producer_a_window_gather_reads_many_times_is_computed_once():
    """A pointwise chain feeding a 3x3 convolution: the im2col packing
    reads each element once per tap (9 times), so the chain is computed
    once -- into the zero-padded copy of the input, which reads each
    element once -- and packed from there, not recomputed per tap; a
    single-op producer (the relu alone) lands in that copy too."""
    x, w = torch.randn(2, 8, 12, 12), torch.randn(16, 8, 3, 3)
    s, t = torch.randn(8, 1, 1), torch.randn(8, 1, 1)

    def f(x, s, t, w):
        y = A.relu.default(A.add.Tensor(A.mul.Tensor(A.sub.Tensor(x, t), s), 3.25))
        return (A.convolution.default(y, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),)

    ins = [x, s, t, w]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True, env=GEMM_ROAD)
    want = f(*[a.double() for a in ins])[0]
    torch.testing.assert_close(k(*ins)[0].double(), want, rtol=1e-4, atol=1e-4)
    # the chain (its constant 3.25 = 0x1.ap+1) is in one kernel, and that
    # kernel is the producer's own: before the packing kernel and the GEMM
    assert k.kinds == ["pointwise", "pointwise", "extern", "pointwise"], k.kinds
    body = k.source.split("#endif", 1)[1]
    kernels = re.split(r"\n/\* k\d+: ", body)[1:]   # each kernel opens with its comment
    holding = [i for i, src in enumerate(kernels) if "0x1.ap+1f" in src]
    assert holding == [0], k.source

    def g(x, w):
        y = A.relu.default(x)
        return (A.convolution.default(y, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),)

    gm = tk.aten_graph(g, [x, w], decompose=False)
    k = tk.compile_fx(gm, [x, w], env=GEMM_ROAD)
    assert k.kinds == ["pointwise", "pointwise", "extern", "pointwise"], k.kinds
    torch.testing.assert_close(k(x, w)[0], g(x, w)[0], rtol=1e-4, atol=1e-4)


def test_relu_backward_mask_loop_is_vectorized(tmp_path):
    """A ReLU backward in a transposing (planned) loop nest: the element
    loop carries the SIMD pragma, and with the build's flags gcc
    vectorizes the select instead of branching on every element's sign."""
    g, y = torch.randn(16, 8, 256), torch.randn(8, 16, 256)

    def f(g, y):
        yt = A.permute.default(y, [1, 0, 2])
        return (A.where.self(A.le.Scalar(yt, 0.0), A.mul.Tensor(g, 0.0), A.mul.Tensor(g, 1.5)),)

    gm = tk.aten_graph(f, [g, y], decompose=False)
    k = tk.compile_fx(gm, [g, y], keep_source=True)
    torch.testing.assert_close(k(g, y)[0], f(g, y)[0])
    assert "#pragma omp simd" in k.source, k.source
    r = vectorize_report(tmp_path, k.source)
    assert re.search(r"k\.c:\d+:\d+: optimized: loop vectorized", r.stderr), (r.stderr, k.source)


def test_activations_between_convolutions_are_channels_last():
    """Inference convolutions on the CPU's oneDNN road: a value that feeds
    a convolution and lives inside the graph is stored channels last, so
    the next oneDNN step reads it and writes its own result in that layout
    (`.sa`/`.sc` strides of the steps), a 1x1 convolution on it is the
    NHWC GEMM (no oneDNN step), a depthwise one reads it too. The first
    step reads the graph's NCHW input and writes channels last (it reaches
    the next convolution); the last one writes NCHW, since its result only
    ends, through the residual add, in the graph's output, which keeps
    eager's contiguous layout. Fresh inputs, against eager in float64."""
    g = torch.Generator().manual_seed(SEED)
    N, C, H = 2, 8, 12

    def r(*shape, lo=-1.0, hi=1.0):
        return torch.rand(shape, generator=g) * (hi - lo) + lo
    x, w1, w2, w3, w4 = r(N, C, H, H, lo=-2, hi=2), r(16, C, 3, 3), r(16, 16, 1, 1), r(16, 1, 3, 3), r(16, 16, 3, 3)
    b2 = r(16)

    def f(x, w1, w2, b2, w3, w4):
        conv = A.convolution.default
        y = A.relu.default(conv(x, w1, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1))
        z = A.relu.default(conv(y, w2, b2, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
        d = conv(z, w3, None, [2, 2], [1, 1], [1, 1], False, [0, 0], 16)
        e = conv(A.mul.Tensor(d, A.sigmoid.default(d)), w4, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
        return A.add.Tensor(e, d)
    ins = [x, w1, w2, b2, w3, w4]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN")
    steps = re.findall(r"static tcc_dnnl_conv k\d+_conv = \{.kind = 0.*?\.sa = (\{[^}]*\}).*?\.sc = (\{[^}]*\})",
                       k.source, re.S)
    nhwc = {"{%d, 1, %d, %d}" % (H * H * 16, H * 16, 16),          # [2, 16, 12, 12]
            "{%d, 1, %d, %d}" % (6 * 6 * 16, 6 * 16, 16)}          # [2, 16, 6, 6]
    assert len(steps) == 3, steps                  # 3x3, depthwise, 3x3; the 1x1 is a GEMM
    assert steps[0][0] == "{%d, %d, %d, 1}" % (C * H * H, H * H, H), steps   # the graph's input
    assert steps[0][1] in nhwc and steps[1][0] in nhwc and steps[1][1] in nhwc, steps
    assert steps[2][0] in nhwc and steps[2][1] == "{%d, %d, %d, 1}" % (16 * 36, 36, 6), steps
    assert "dnnl_sgemm(" in k.source
    out = k(*ins)[0]
    assert out.is_contiguous()
    want = f(*[t.double() for t in ins])
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)


def test_convolution_backward_runs_on_channels_last_activations():
    """A training step's backward: the saved input x arrives channels last
    (the client lays saved activations out so), and the incoming gradient
    is computed in the graph (relu's backward). The gradient is realized
    channels last, both oneDNN steps (backward data, kind 1; backward
    weights, kind 2) read their activations as NHWC (`.sa`/`.sb` strides)
    and the input's gradient, which a later kernel of the graph reads, is
    written NHWC (`.sc`). Fresh inputs, against eager in float64."""
    g = torch.Generator().manual_seed(SEED)
    N, C, K, H = 2, 8, 16, 10
    x = torch.randn(N, C, H, H, generator=g).to(memory_format=torch.channels_last)
    y = torch.randn(N, K, H, H, generator=g).to(memory_format=torch.channels_last)
    gin = torch.randn(N, K, H, H, generator=g).to(memory_format=torch.channels_last)
    w = torch.randn(K, C, 3, 3, generator=g)

    def f(gin, y, x, w):
        gy = A.threshold_backward.default(gin, y, 0.0)
        gx, gw, gb = A.convolution_backward.default(gy, x, w, [K], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                    [True, True, True])
        return A.tanh.default(gx), gw, gb
    ins = [gin, y, x, w]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN")
    steps = {int(m[0]): m[1:] for m in re.findall(
        r"static tcc_dnnl_conv k\d+_conv = \{.kind = (\d).*?\.sa = (\{[^}]*\}).*?\.sb = (\{[^}]*\})"
        r".*?\.sc = (\{[^}]*\})", k.source, re.S)}
    nhwc = {K: "{%d, 1, %d, %d}" % (H * H * K, H * K, K), C: "{%d, 1, %d, %d}" % (H * H * C, H * C, C)}
    assert sorted(steps) == [1, 2], steps
    assert steps[1][0] == nhwc[K] and steps[1][2] == nhwc[C], steps      # gy in, gx out
    assert steps[2][0] == nhwc[C] and steps[2][1] == nhwc[K], steps      # x and gy in
    out = k(*ins)
    want = f(*[t.double() for t in ins])
    for a, b in zip(out, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-4, atol=1e-4)


def test_batch_norm_statistics_on_channels_last_are_column_sums_in_stages(tmp_path):
    """A training batch norm's statistics over channels-last activations:
    the mean, then the variance around it, per channel. Both are column
    sums (the channel innermost, in blocks of columns, a SIMD loop over
    the block's channels in each row), the second stage reading the
    first's sums from their array, where a loop per channel had gathered
    at the stride of a pixel. The loops are vector code; fresh inputs
    (away from zero mean), against eager in float64."""
    g = torch.Generator().manual_seed(SEED)
    N, C, H = 4, 40, 9
    x = (torch.randn(N, C, H, H, generator=g) * 3 + 2).to(memory_format=torch.channels_last)

    def f(x):
        var, mean = A.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)
        return mean, A.rsqrt.default(A.add.Tensor(var, 1e-5))
    ins = [x]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    assert re.search(r"for \(int64_t i\d+c = 0;", k.source), k.source
    assert len(re.findall(r"float a\d+p\[\d+\] = \{0\};", k.source)) == 2, k.source
    assert re.search(r"= \(float\)a\d+\[i\d+ - i\d+c\];\n(.*\n){1,12}.*a\d+p\[i\d+ - i\d+c\] \+=",
                     k.source), k.source                  # the variance reads the sums of the mean
    assert_vector_code(tmp_path, k.source)
    out = k(*ins)
    want = f(x.double())
    for a, b in zip(out, want):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=1e-5)


def test_channels_last_epilogue_computes_per_channel_values_once(tmp_path):
    """A batch norm's epilogue on channels-last activations runs the
    channel innermost: its 1 / sqrt(var + eps) varies along the element
    loop alone, so it is a column value, computed once per channel into
    an array before the loops (h0) and loaded there, instead of a square
    root and a division per element. A value that varies along the other
    loops too (x - mean) stays in the element loop. The loop still
    vectorizes; fresh inputs, against eager in float64."""
    g = torch.Generator().manual_seed(SEED)
    N, C, H = 3, 24, 10
    x = torch.randn(N, C, H, H, generator=g).to(memory_format=torch.channels_last)
    mean, w, b = torch.randn(C, generator=g), torch.randn(C, generator=g), torch.randn(C, generator=g)
    var = torch.rand(C, generator=g) + 0.5

    def f(x, mean, var, w, b):
        inv = A.reciprocal.default(A.sqrt.default(A.add.Tensor(var, 1e-5)))
        y = A.mul.Tensor(A.sub.Tensor(x, A.view.default(mean, [C, 1, 1])), A.view.default(inv, [C, 1, 1]))
        return A.relu.default(A.add.Tensor(A.mul.Tensor(y, A.view.default(w, [C, 1, 1])),
                                           A.view.default(b, [C, 1, 1])))
    ins = [x, mean, var, w, b]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    assert re.search(r"float h0\[%d\];" % C, k.source), k.source
    body = k.source[k.source.index("h0[i1] = "):]
    assert "sqrtf(" in k.source and "sqrtf(" not in body, k.source
    assert re.search(r"= h0\[i1\];", body), k.source
    assert "loop vectorized" in vectorize_report(tmp_path, k.source).stderr
    out = k(*ins)[0]
    want = f(*[t.double() for t in ins])
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5)


def test_pooling_window_element_loop_is_vector_code(tmp_path):
    """ResNet's stem: batch norm + relu + 3x3/2 max pool on channels-last
    activations is one kernel whose element loop (the channels) holds the
    unrolled window. Its NaN flag is integer arithmetic (tcc_nan_bit32):
    with `flag |= t != t` gcc's report said "vectorized" but the object
    held only scalar code. So this looks at the object: packed AVX2
    instructions in the kernel's body. NaNs (two in one window) still come
    out as NaN; fresh inputs, against eager in float64."""
    g = torch.Generator().manual_seed(SEED)
    N, C, H = 2, 32, 12
    x = torch.randn(N, C, H, H, generator=g)
    x[0, 0, 0, 0] = x[1, 3, 0, 1] = float("nan")
    x = x.to(memory_format=torch.channels_last)
    scale, shift = torch.randn(C, generator=g), torch.randn(C, generator=g)

    def f(x, scale, shift):
        y = A.relu.default(A.add.Tensor(A.mul.Tensor(x, A.view.default(scale, [C, 1, 1])),
                                        A.view.default(shift, [C, 1, 1])))
        return A.max_pool2d_with_indices.default(y, [3, 3], [2, 2], [1, 1])[0]
    ins = [x, scale, shift]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    assert "tcc_nan_bit32(" in k.source and "!= t" not in k.source, k.source
    assert_vector_code(tmp_path, k.source)
    out = k(*ins)[0]
    want = f(*[t.double() for t in ins])
    torch.testing.assert_close(out.double(), want, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert torch.isnan(out).sum() == torch.isnan(want).sum() > 0


def test_padded_window_reads_are_vector_code(tmp_path):
    """A padded 3x3 stride-2 max pool (ResNet's and DenseNet's stem, after
    a relu) reads its window through clamped indices, no affine form of
    the loop variables: the index is read as an int32 (the buffer's span
    fits one), so that the element loop gathers; with int64 indices gcc
    kept it scalar, 10x slower on the Zen 5 VM. Affine indices stay
    int64. Exact against eager, NaN included; fresh inputs."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, 8, 16, 16, generator=g)
    x[1, 3, 4, 7] = float("nan")

    def f(x):
        return A.max_pool2d_with_indices.default(A.relu.default(x), [3, 3], [2, 2], [1, 1])[0]
    gm = tk.aten_graph(f, [x], decompose=False)
    k = tk.compile_fx(gm, [x], keep_source=True)
    body = tk.kernel_text(k.source, r"k\d+: ")
    assert "b0[(int32_t)(" in body and "b1[(int32_t)(" not in body, body   # the store is affine
    assert_vector_code(tmp_path, k.source)
    torch.testing.assert_close(k(x)[0], f(x), rtol=0, atol=0, equal_nan=True)


def test_max_pool_indices_are_vector_code(tmp_path):
    """A max pool's indices (what training saves for the backward) after
    a relu, in one kernel with its values: the window's argmax updates
    without branches and tests NaN by integer arithmetic, the last NaN is
    a MAX of input indices over the masked window, and the argmax position
    decodes by int32 division; with the old forms (`if (t > v || t != t
    ...)`, an argmax of `ok && isnan(v)`, int64 division) gcc kept the
    element loop scalar, 9x slower on the Zen 5 VM. Exact values and
    indices against eager: fresh inputs with NaNs (two in one window, the
    last one wins), ties (duplicated maxima, the first wins) and windows
    of -inf."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(2, 8, 16, 16, generator=g)
    x[1, 3, 4, 6] = x[1, 3, 4, 7] = float("nan")
    x[0, 2, 9, 9] = x[0, 2, 9, 10] = x.abs().max() + 1      # a tie inside one window
    x[0, 5, :3, :3] = float("-inf")                         # relu makes these 0: still ties
    x[1, 6] = -x[1, 6].abs()                                # a whole plane of zeros after relu

    def f(x):
        return A.max_pool2d_with_indices.default(A.relu.default(x), [3, 3], [2, 2], [1, 1])

    def g_(x):
        return A.max_pool2d_with_indices.default(x, [3, 3], [2, 2], [1, 1])
    for fn in (f, g_):
        gm = tk.aten_graph(fn, [x], decompose=False)
        k = tk.compile_fx(gm, [x], keep_source=True)
        body = tk.kernel_text(k.source, r"k\d+: ")
        assert "if (" not in body and "tcc_floordiv_i64" not in body, body
        assert_vector_code(tmp_path, k.source)
        got, want = k(x), fn(x)
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0, equal_nan=True)
        assert torch.equal(got[1], want[1])
    xi = x.clone()
    xi[0, 1, 5:8, 5:8] = float("-inf")                      # a window of -inf only (no relu)
    gm = tk.aten_graph(g_, [xi], decompose=False)
    assert torch.equal(tk.compile_fx(gm, [xi])(xi)[1], g_(xi)[1])


def test_concatenation_reads_one_input_per_range(tmp_path):
    """DenseNet's concatenation of seven inputs + batch norm + relu is one
    kernel whose channel loop runs once per input's range of channels
    (cpu/schedule.c, range split): inside each, the "which input"
    comparisons are constants, so an element loads its own input alone --
    no selects, no clamps (a select among all seven loaded all seven, at a
    tenth of the memory's speed in a 13-input one) -- and the object holds
    vector code. Exact against eager, NaN included; fresh inputs."""
    g = torch.Generator().manual_seed(SEED)
    sizes = (64, 32, 32, 32, 32, 32, 32)
    C = sum(sizes)
    xs = [torch.randn(2, c, 8, 8, generator=g) for c in sizes]
    xs[3][0, 5, 1, 2] = float("nan")
    m, r = torch.randn(C, generator=g), torch.rand(C, generator=g) + 0.5

    def f(*t):
        *parts, m, r = t
        y = A.cat.default(list(parts), 1)
        return A.relu.default(A.mul.Tensor(A.sub.Tensor(y, A.view.default(m, [C, 1, 1])),
                                           A.view.default(r, [C, 1, 1])))
    ins = xs + [m, r]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    body = k.source.split("/* tccd: end of preamble */", 1)[1]
    starts = [int(x) for x in re.findall(r"for \(int64_t i1 = (\d+); i1 < \d+; i1\+\+\) \{   /\* range", body)]
    assert starts == [sum(sizes[:j]) for j in range(len(sizes))], body
    assert "tcc_pick32" not in body and "tcc_min64" not in body and "tcc_max64" not in body, body
    assert_vector_code(tmp_path, k.source)
    out = k(*ins)[0]
    torch.testing.assert_close(out, f(*ins), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dim", [0, 1, 2, -1])
def test_concatenation_range_split_any_dim(dim):
    """Concatenations along each dim, of inputs that are views (a
    transpose, a slice with a storage offset, a broadcast), with a
    pointwise consumer: the ranges (the parallel loop's too, along dim 0)
    give eager's values exactly; fresh inputs."""
    g = torch.Generator().manual_seed(SEED + dim)
    shape = [6, 5, 7]
    d = dim % 3
    parts = []
    for j, n in enumerate((3, 1, 4, 2)):
        sz = list(shape)
        sz[d] = n
        if j == 0:
            parts.append(torch.randn(list(reversed(sz)), generator=g).permute(2, 1, 0))
        elif j == 1:
            b = list(sz)
            b[(d + 1) % 3] = 1
            parts.append(torch.randn(b, generator=g).expand(sz))
        elif j == 2:
            parts.append(torch.randn([x + 1 for x in sz], generator=g)[1:, 1:, 1:])
        else:
            parts.append(torch.randn(sz, generator=g))

    def f(*t):
        return A.mul.Tensor(A.cat.default(list(t), dim), 3.0)
    gm = tk.aten_graph(f, parts, decompose=False)
    k = tk.compile_fx(gm, parts, keep_source=True)
    torch.testing.assert_close(k(*parts)[0], f(*parts), rtol=0, atol=0)
    assert "/* range 3 */" in k.source, k.source


def test_padded_conv_pack_peels_its_border(tmp_path):
    """A padded 3x3 convolution's im2col pack reads its input through
    clamped indices (zero outside): the element loop runs in three ranges,
    and in the middle one, where no clamp applies, the loads are
    contiguous and gcc vectorizes the loop; forward and backward match
    eager, with random inputs reaching into every border."""
    x, w = torch.randn(2, 8, 12, 12), torch.randn(16, 8, 3, 3)

    def f(x, w):
        return (A.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),)

    gm = tk.aten_graph(f, [x, w], decompose=False)
    k = tk.compile_fx(gm, [x, w], keep_source=True, env=GEMM_ROAD)
    torch.testing.assert_close(k(x, w)[0], f(x, w)[0], rtol=1e-5, atol=1e-5)
    lines = k.source.splitlines()
    # the middle range: the peeling's, or the range split's (a padded copy
    # of the input, whose clamps read the element loop's var alone)
    middle = [i for i, ln in enumerate(lines) if "clamps in range" in ln or "/* range 1 */" in ln]
    assert middle, k.source

    def body(i):   # the lines of the loop whose header is line i
        ind = len(lines[i]) - len(lines[i].lstrip())
        end = next(j for j in range(i + 1, len(lines)) if lines[j] == " " * ind + "}")
        return "\n".join(lines[i + 1:end]), end

    for i in middle:
        mid, end = body(i)
        after, _ = body(end + 2)   # the last range: pragma, then its header
        # the middle range drops the clamps on the element loop's var
        assert mid.count("tcc_min64(") < after.count("tcc_min64("), (mid, after)
    # gcc reports an OpenMP simd loop at its pragma's line (1-based: i)
    r = vectorize_report(tmp_path, k.source)
    vec = {int(m.group(1)) for m in re.finditer(r"k\.c:(\d+):\d+: optimized: loop vectorized", r.stderr)}
    assert all(lines[i - 1].strip().startswith("#pragma omp simd") for i in middle), k.source
    assert {i for i in middle} <= vec, (middle, r.stderr)

    # the gradient of a padded convolution gathers through clamps too
    gy = torch.randn(2, 16, 12, 12)

    def g(gy, x, w):
        return A.convolution_backward.default(gy, x, w, [16], [1, 1], [1, 1], [1, 1], False,
                                              [0, 0], 1, [True, True, True])

    gm = tk.aten_graph(g, [gy, x, w], decompose=False)
    kb = tk.compile_fx(gm, [gy, x, w], keep_source=True, env=GEMM_ROAD)
    for got, want in zip(kb(gy, x, w), g(gy, x, w)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    # gy's padded pack for grad_input
    assert "clamps in range" in kb.source or "/* range 1 */" in kb.source, kb.source


def test_head_merge_is_split_into_affine_loops(tmp_path):
    """Attention's head merge ([b, h, t, dh] -> [b*t, h*dh], a reshape
    across a transpose) reads element (i, j) at (i / t, j / dh, i % t,
    j % dh): split.c iterates i and j as two loops each, so the kernel has
    no division or modulo left and gcc vectorizes it; the values are
    eager's. A reduction over such a view keeps its div/mod form."""
    x = torch.randn(4, 4, 24, 16)
    y = torch.randn(96, 64)

    def f(x, y):
        m = A.view.default(A.clone.default(A.permute.default(x, [0, 2, 1, 3]),
                                           memory_format=torch.contiguous_format), [96, 64])
        return (A.add.Tensor(A.mul.Tensor(m, 2.0), y),)

    gm = tk.aten_graph(f, [x, y], decompose=False)
    k = tk.compile_fx(gm, [x, y], keep_source=True)
    torch.testing.assert_close(k(x, y)[0], f(x, y)[0], rtol=0, atol=0)
    body = k.source.split("#endif", 1)[1]
    assert "/ INT64_C" not in body and "% INT64_C" not in body, k.source
    r = vectorize_report(tmp_path, k.source)
    assert re.search(r"k\.c:\d+:\d+: optimized: loop vectorized", r.stderr), (r.stderr, k.source)

    # odd strides and a dim split twice (i / 6 and then i % 4 inside it)
    z = torch.randn(3, 5, 6, 4)

    def g(z):
        m = A.view.default(A.clone.default(A.permute.default(z, [2, 0, 3, 1]),
                                           memory_format=torch.contiguous_format), [18, 20])
        return (A.sin.default(m), A.sum.dim_IntList(m, [1]))

    gm = tk.aten_graph(g, [z], decompose=False)
    k = tk.compile_fx(gm, [z], keep_source=True)
    for got, want in zip(k(z), g(z)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_native_layer_norm_three_outputs_one_kernel():
    x = torch.randn(32, 64)
    gm, ins = tk.op_graph(A.native_layer_norm.default, (x, [64], torch.randn(64), torch.randn(64), 1e-5), nout=3)
    k = tk.compile_fx(gm, ins)
    assert k.kernels == 1
    for got, want in zip(k(*ins), A.native_layer_norm.default(*ins, [64][0:0] or [64], *[]) if False else
                         A.native_layer_norm.default(ins[0], [64], ins[1], ins[2], 1e-5)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


def test_sibling_reductions_share_a_loop():
    x = torch.randn(16, 100)
    def f(x):
        return A.amax.default(x, [1]), A.sum.dim_IntList(x, [1]), A.amin.default(x, [1])
    gm = tk.aten_graph(f, [x], decompose=False)
    k = tk.compile_fx(gm, [x], keep_source=True)
    assert k.kernels == 1
    body = k.source[k.source.index("/* k0"):]
    assert len(re.findall(r"#pragma omp simd reduction\(\|:bad\) reduction\(", body)) == 1, body
    for got, want in zip(k(x), f(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_unrelated_total_is_not_merged_into_a_larger_kernel():
    # a loss's count of valid labels (a 0-d sum over other data) beside a
    # batch norm's apply: merged, the CUDA target gave the whole kernel one
    # block (its reductions decide the rows); kept apart, both run at size
    x = torch.randn(4, 8, 6, 6)
    lab = torch.randint(0, 5, (4,))
    def f(x, lab):
        y = A.relu.default(A.mul.Tensor(x, 2.0))
        n = A.sum.default(A.ne.Scalar(lab, -100))
        return y, n
    gm = tk.aten_graph(f, [x, lab], decompose=False)
    k = tk.compile_fx(gm, [x, lab])
    assert k.kernels == 2
    for got, want in zip(k(x, lab), f(x, lab)):
        torch.testing.assert_close(got, want)


def test_row_statistic_still_merges_with_its_rows():
    # a row statistic stored beside the rows it summarizes (both read x):
    # one kernel
    x = torch.randn(16, 100)
    def f(x):
        return A.sum.dim_IntList(x, [1], True), A.mul.Tensor(x, 3.0)
    gm = tk.aten_graph(f, [x], decompose=False)
    k = tk.compile_fx(gm, [x])
    assert k.kernels == 1
    for got, want in zip(k(x), f(x)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_var_mean_is_one_kernel_two_passes():
    x = torch.randn(8, 300) * 3 + 1000   # a one-pass formula would lose digits
    gm, ins = tk.op_graph(A.var_mean.correction, (x, [1]), {}, nout=2)
    k = tk.compile_fx(gm, ins, keep_source=True)
    assert k.kernels == 1
    assert len(re.findall(r"#pragma omp simd reduction\(\|:bad\) reduction\(", k.source)) == 2
    for got, want in zip(k(*ins), A.var_mean.correction(x, [1])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)


def test_reduction_not_recomputed_per_element():
    # softmax over dim 0: the column statistics cannot be hoisted out of a
    # row-major loop nest, so they are computed once into a buffer rather
    # than inlined into every element
    x = torch.randn(64, 48)
    def f(x):
        m = A.amax.default(x, [0], True)
        return A.div.Tensor(A.exp.default(A.sub.Tensor(x, m)), A.sum.dim_IntList(A.exp.default(A.sub.Tensor(x, m)), [0], True))
    gm = tk.aten_graph(f, [x], decompose=False)
    k = tk.compile_fx(gm, [x], keep_source=True)
    assert k.kernels >= 2
    torch.testing.assert_close(k(x)[0], f(x), rtol=1e-5, atol=1e-6)
    # no reduction loop (one with an accumulator clause) sits inside the
    # element loop over dim 0; the element loop itself may be SIMD
    src = k.source
    for m in re.finditer(r"for \(int64_t i0 = 0; i0 < 64; i0\+\+\) \{(.*?)\n  \}", src, re.S):
        assert "#pragma omp simd reduction(|:bad) reduction(" not in m.group(1)


def test_stored_producer_is_read_not_recomputed_in_a_reduction():
    """A tanh-GELU backward feeds a GEMM (so it is stored anyway) and a
    bias-gradient reduction over rows: the reduction reads the stored
    values instead of recomputing the tanh chain per element; a cheap
    producer is still inlined."""
    g = torch.randn(64, 256)
    x = torch.randn(64, 256)
    w = torch.randn(256, 32)

    def f(g, x, w):
        t = torch.tanh(0.79788456 * (x + 0.044715 * x * x * x))
        dx = g * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * 0.79788456 * (1 + 0.134145 * x * x))
        return A.mm.default(dx, w), A.sum.dim_IntList(dx, [0], True), A.sum.dim_IntList(
            A.mul.Tensor(g, 2.0), [0], True)

    gm = tk.aten_graph(f, [g, x, w])
    k = tk.compile_fx(gm, [g, x, w], keep_source=True)
    want = f(g.double(), x.double(), w.double())
    for got, ref in zip(k(g, x, w), want):
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)
    # tanhf appears once (the producer), not again in the reduction
    calls = re.findall(r"tanhf\(", k.source.split("#endif", 1)[1])
    assert len(calls) == 1, k.source


def test_kept_producer_is_read_after_a_reduction_between():
    """DenseNet's backward: a max pool's backward (a window sum per
    element: a producer that holds a reduction, so the batch norm's
    per-channel sums keep their load of it and it is stored) feeds the
    normalization's gradient, which also reads those per-channel sums.
    That kernel cannot join the producer's (the sums' kernel sits between
    them), so it reads the stored values instead of gathering the windows
    again; here the window is a sum over a last dim of 2 and a tanh chain.
    Fresh inputs, against eager in float64."""
    g = torch.Generator().manual_seed(SEED)
    N, C, H = 4, 16, 12
    x, y = torch.randn(N, C, H, H, 2, generator=g), torch.randn(N, C, H, H, generator=g)

    def f(x, y):
        w = A.sum.dim_IntList(x, [4])
        p = A.mul.Tensor(A.tanh.default(A.mul.Tensor(w, y)), A.add.Tensor(A.mul.Tensor(w, w), 1.0))
        s = A.sum.dim_IntList(p, [0, 2, 3], True)
        return A.mul.Tensor(A.sub.Tensor(p, A.div.Tensor(s, N * H * H)), y), s
    ins = [x, y]
    k = compiled_against_f64(f, ins)
    calls = re.findall(r"tanhf\(", k.source.split("#endif", 1)[1])
    assert len(calls) == 1, k.source


def _innermost_loops(source):
    """The bodies of the innermost loops of generated C (no braces inside)."""
    return re.findall(r"for \(int64_t i\d+ = [^;]*; [^;]*; [^)]*\) \{([^{}]*)\}", source)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_costly_producer_read_across_a_gap_is_stored(dtype):
    """The torch.compile tutorial's numpy program sums an outer product
    of two normalized matrices, einsum('ij,ik->ijk', xn, yn) summed over
    j and k: yn[i, k] is read inside the loop over k, itself inside the
    one over j, which it does not read. Inlined, its normalization (a
    division) ran 640 times per element; it is stored once and loaded.
    xn[i, j] is read outside the k loop: still inlined (hoisted there).
    A cheap producer read across such a gap stays inlined. Fresh inputs
    against float64."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(48, 40, generator=g, dtype=dtype)
    y = torch.randn(48, 40, generator=g, dtype=dtype) * 3 + 1
    c = torch.randn(48, 40, generator=g, dtype=dtype)

    def f(x, y, c):
        xn = A.div.Tensor(A.sub.Tensor(x, A.mean.dim(x, [0])), A.std.correction(x, [0], correction=0))
        yn = A.div.Tensor(A.sub.Tensor(y, A.mean.dim(y, [0])), A.std.correction(y, [0], correction=0))
        outer = A.mul.Tensor(A.unsqueeze.default(xn, 2), A.unsqueeze.default(yn, 1))
        cheap = A.mul.Tensor(A.unsqueeze.default(x, 2), A.unsqueeze.default(A.add.Tensor(c, 1.0), 1))
        return A.sum.dim_IntList(outer, [1, 2]), A.sum.dim_IntList(cheap, [1, 2])

    ins = [x, y, c]
    gm = tk.aten_graph(f, ins, decompose=False)
    k = tk.compile_fx(gm, ins, keep_source=True)
    want = f(*[t.double() for t in ins])
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    for got, ref in zip(k(*ins), want):
        torch.testing.assert_close(got.double(), ref, rtol=tol, atol=tol * ref.abs().max().item())
    body = k.source.split("#endif", 1)[1]
    sums = [b for b in _innermost_loops(body) if re.search(r"\ba\d+p? \+=", b)]
    assert sums, body
    # one division in the loop over k: xn's, which reads j only (gcc
    # hoists it); yn's is not recomputed for every j
    assert max(b.count(" / ") for b in sums) == 1, body
    # the cheap one: c + 1 stays in the loop over k (not stored)
    assert any(re.search(r" \+ (0x1p\+0|1\.0)", b) for b in sums), body


def test_reduction_read_across_a_gemm_is_computed_once():
    """A reduction read by a kernel before a GEMM and by one after it
    (those cannot merge) is stored once and loaded, not run in both."""
    x = torch.randn(64, 32, 5)
    w = torch.randn(32, 32)

    def f(x, w):
        r = A.sum.dim_IntList(x, [2])
        m = A.mm.default(A.relu.default(r), w)
        return A.mul.Tensor(r, m)

    gm = tk.aten_graph(f, [x, w], decompose=False)
    k = tk.compile_fx(gm, [x, w], keep_source=True)
    torch.testing.assert_close(k(x, w)[0].double(), f(x.double(), w.double()),
                               rtol=1e-4, atol=1e-4)
    assert len(re.findall(r"/\* k\d+: reduction over", k.source)) == 1, k.source


def test_pointwise_chain_is_one_kernel_and_workspace_is_reused():
    x = torch.randn(64, 32)
    w1, w2, w3 = torch.randn(32, 32), torch.randn(32, 32), torch.randn(32, 32)
    def f(x, w1, w2, w3):
        h = A.relu.default(A.mm.default(x, w1))
        h = A.sigmoid.default(A.mm.default(h, w2))
        return A.tanh.default(A.mm.default(h, w3))
    gm = tk.aten_graph(f, [x, w1, w2, w3], decompose=False)
    k = tk.compile_fx(gm, [x, w1, w2, w3])
    assert k.kinds == ["extern", "pointwise", "extern", "pointwise", "extern", "pointwise"]
    one = 64 * 32 * 4
    # five temporaries (3 GEMM results, 2 activations) of 8 KiB each; live
    # at most two at a time
    assert k.workspace <= 3 * one, k.workspace
    torch.testing.assert_close(k(x, w1, w2, w3)[0], f(x, w1, w2, w3), rtol=1e-4, atol=1e-4)


def test_no_fusion_env_gives_one_kernel_per_op():
    x = torch.randn(16, 16)
    def f(x):
        return A.cos.default(A.sin.default(A.exp.default(x)))
    gm = tk.aten_graph(f, [x], decompose=False)
    fused = tk.compile_fx(gm, [x])
    env = dict(os.environ, TCC_NO_FUSION="1")
    unfused = tk.compile_fx(gm, [x], env=env)
    assert fused.kernels == 1 and unfused.kernels == 3
    torch.testing.assert_close(unfused(x)[0], f(x))


def test_pointwise_inner_loop_is_vectorized(tmp_path):
    x = torch.randn(256, 300)
    y = torch.randn(300)
    def f(x, y):
        return A.mul.Tensor(A.add.Tensor(x, y), 0.5)
    gm = tk.aten_graph(f, [x, y], decompose=False)
    k = tk.compile_fx(gm, [x, y], keep_source=True)
    r = vectorize_report(tmp_path, k.source)
    assert re.search(r"k\.c:\d+:\d+: optimized: loop vectorized", r.stderr), r.stderr


def test_reduction_loop_is_vectorized(tmp_path):
    req = load_request(os.path.join(GRAPHS, "softmax.json"))
    k = tk.compile_request(req, keep_source=True)
    r = vectorize_report(tmp_path, k.source)
    lines = [l for l in r.stderr.splitlines() if "loop vectorized" in l]
    assert lines, r.stderr   # the max pass at least


# ------------------------------------------------------------ golden

GOLDEN = sorted(glob.glob(os.path.join(HERE, "golden", "*.json")))


def group_lines(info):
    return [f"{kind}: {', '.join(n or '<tmp>' for n in names)}" for kind, names in info]


@pytest.mark.parametrize("path", GOLDEN, ids=[os.path.basename(p) for p in GOLDEN])
def test_golden_grouping(path):
    req = load_request(path)
    k = tk.compile_request(req)
    got = group_lines(k.groups)
    want_path = path[:-5] + ".groups"
    if os.environ.get("TCC_GOLDEN_UPDATE"):
        with open(want_path, "w") as f:
            f.write("\n".join(got) + "\n")
    with open(want_path) as f:
        want = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#")]
    assert got == want


def test_golden_files_exist():
    assert len(GOLDEN) >= 5


# ------------------------------------------------------ whole models

def aot_graphs(model, inputs, train):
    """The forward (and backward) ATen graphs AOTAutograd makes with core
    ATen decompositions, with the example inputs each one received."""
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified
    from functorch.compile import make_boxed_func
    graphs = []

    def comp(gm, ex):
        def run(args):
            graphs.append((gm, [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]))
            return gm(*args)
        run._boxed_call = True
        return run

    def backend(gm, ex):
        return aot_module_simplified(gm, ex, fw_compiler=comp, bw_compiler=comp,
                                     decompositions=core_aten_decompositions())
    from torch.nn.attention import SDPBackend, sdpa_kernel
    model.train(train)
    torch._dynamo.reset()
    f = torch.compile(model, backend=backend)
    with sdpa_kernel([SDPBackend.MATH]):   # attention as bmm/softmax, not a fused CPU kernel
        y = f(*inputs)
        if train:
            y.float().sum().backward()
    return graphs


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.l2, self.ln = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32), torch.nn.LayerNorm(32)

    def forward(self, x):
        return self.ln(x + self.l2(torch.nn.functional.gelu(self.l1(x))))


class NormBlock(torch.nn.Module):   # ResNet-style block minus convolution
    def __init__(self):
        super().__init__()
        self.b1, self.b2 = torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(x + self.b2(torch.relu(self.b1(x)) * 0.5))


MODELS = {
    "mlp": (MLP, lambda: [torch.randn(4, 8, 32)]),
    "encoder": (lambda: torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True),
                lambda: [torch.randn(2, 6, 32)]),
    "normblock": (NormBlock, lambda: [torch.randn(2, 8, 5, 5)]),
}


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("train", [False, True])
def test_model_graphs(name, train):
    make, inputs = MODELS[name]
    torch.manual_seed(SEED)
    graphs = aot_graphs(make(), inputs(), train)
    assert graphs
    for gm, args in graphs:
        tens = [a for a in args if isinstance(a, torch.Tensor)]
        assert len(tens) == len(args)
        clean, keep = tk.sanitize(gm)
        k = tk.compile_fx(clean, tens)
        got = k(*tens)
        want = gm(*tens)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        want = [want[i] for i in keep]
        for g, w in zip(got, want):
            torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-4)


def test_loop_order_tuning_config_reorders_a_transpose():
    """The autotuner's loop-order knob (order=1: loops ordered by the first
    load's strides instead of the store's) turns the loop nest of a
    transposing copy around and still computes eager's result."""
    def f(x, y):
        return x.permute(1, 0).contiguous() + y.exp()
    x, y = torch.randn(96, 80), torch.randn(80, 96)
    gm = tk.aten_graph(f, [x, y], decompose=False)
    loops = {}
    for order in (0, 1):
        cfg = f"par=0 thr=0 chunk=0 unroll=0 blas=0 vec=0 order={order}"
        k = tk.compile_fx(gm, [x, y], env=dict(os.environ, TCC_TUNE_CONFIG=cfg), keep_source=True)
        out = k(x, y)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, f(x, y), rtol=1e-6, atol=1e-6)
        loops[order] = re.findall(r"for \(int64_t i\d+ = 0; i\d+ < (\d+);", k.source)
    assert loops[0] == ["80", "96"], loops      # the store (80 x 96, row-major) innermost
    assert loops[1] == ["96", "80"], loops      # the transposed read innermost


def test_attention_gradient_is_packed_once_for_both_gemms():
    """BERT's backward: the query gradient of the attention, its heads
    merged ([b, h, s, d] -> [tokens, features]), feeds the weight
    gradient dW = dQ^T . X, the input gradient dQ . W^T and the bias
    gradient (a sum over tokens). Both GEMMs read one pack of it, made
    along its runs of d; before, the dW GEMM had a pack of its own,
    [features, tokens], gathered at the head stride. Fresh inputs,
    against float64."""
    g = torch.Generator().manual_seed(SEED)
    B, H, S, D, F = 2, 4, 16, 8, 24

    def heads(t):      # a projection's [b * s, h * d] as [b, h, s, d], heads inner in memory
        return A.permute.default(A.view.default(t, [B, S, H, D]), [0, 2, 1, 3])

    def f(q, k, v, dout, x, w):
        qh, kh, vh = heads(q), heads(k), heads(v)
        out, lse = A._scaled_dot_product_flash_attention_for_cpu.default(qh, kh, vh)[:2]
        dq = A._scaled_dot_product_flash_attention_for_cpu_backward.default(
            heads(dout), qh, kh, vh, out, lse, 0.0, False)[0]
        flat = A.view.default(A.permute.default(dq, [0, 2, 1, 3]), [B * S, H * D])
        return (A.mm.default(A.permute.default(flat, [1, 0]), x), A.sum.dim_IntList(flat, [0]),
                A.mm.default(flat, A.permute.default(w, [1, 0])))
    ins = [torch.randn(B * S, H * D, generator=g) for _ in range(4)]
    ins += [torch.randn(B * S, F, generator=g), torch.randn(F, H * D, generator=g)]
    k = compiled_against_f64(f, ins)
    packs = re.findall(rf"/\* k\d+: \w+ over \[1, {B * S}, {H * D}\]", k.source)
    assert len(packs) == 1, k.source


@pytest.mark.skipif(__import__("tccd.config", fromlist=["x"]).host_cpu_isa() != "x86-64-v4",
                    reason="needs an AVX-512 (x86-64-v4) host to run v4 code")
def test_erf_on_avx512_is_the_inline_one_and_within_2_ulp():
    """On x86-64-v4 targets a float32 erf prints the prelude's tcc_erff
    (faster there than libmvec's). Against erf in float64 on fresh
    random inputs over its whole range, tiny ones, both branches' border
    (|x| = 0.9277) and special values, within 2 ulp. GELU is x ndtr(x)
    (tcc_ndtrf: Abramowitz and Stegun's erfc, as PyTorch's CPU kernel
    computes it): ndtr within 3e-7 of float64's (the formula's 7.5e-8
    and float32's rounding of terms near 1/2; eager's float32 GELU is
    4x further off), so GELU within 3e-7 |x| plus 4 ulp; the special
    values are float64's (GELU of inf is inf; eager's float32 says NaN)."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.cat([torch.randn(4096, generator=g) * 3, torch.randn(256, generator=g) * 1e-20,
                   0.927734375 + torch.randn(256, generator=g) * 1e-3,
                   torch.tensor([0.0, -0.0, 4.0, -4.0, 10.0, -10.0, float("inf"), float("-inf"), float("nan")])])

    def f(x):
        return A.erf.default(x), A.gelu.default(x)
    gm = tk.aten_graph(f, [x], decompose=False)
    k = tk.compile_fx(gm, [x], isa="x86-64-v4", keep_source=True)
    body = k.source.split("#endif", 1)[1]
    assert "tcc_erff(" in body and "tcc_ndtrf(" in body, k.source
    erf, gelu = k(x)

    def ulp(v):
        v = v.float().abs()
        return (torch.nextafter(v, torch.tensor(float("inf"))) - v).double()
    want = torch.erf(x.double())
    finite = want.isfinite()
    assert ((erf.double() - want).abs()[finite] <= 2 * ulp(want)[finite]).all()
    assert torch.equal(erf[~finite].isnan(), want[~finite].isnan())
    torch.testing.assert_close(erf[x.isinf()], want[x.isinf()].float())
    want = torch.nn.functional.gelu(x.double())
    finite = want.isfinite()
    err = (gelu.double() - want).abs()[finite]
    bound = (3e-7 * x.double().abs() + 4 * ulp(want))[finite]
    assert (err <= bound).all(), (err - bound).max()
    torch.testing.assert_close(gelu[~finite], want[~finite].float(), equal_nan=True)


def test_gemm_writes_its_output_without_a_copy():
    """A weight gradient, dW = dY^T . X, is a graph output: the GEMM step
    writes it, with no copy kernel after (each weight gradient of a
    training step had one). A GEMM result that another kernel also reads
    (here through a relu) keeps its copy. Fresh inputs, against float64."""
    g = torch.Generator().manual_seed(SEED)
    dy, x, w = torch.randn(48, 40, generator=g), torch.randn(48, 24, generator=g), torch.randn(24, 40, generator=g)

    def f(dy, x, w):
        dw = A.mm.default(A.permute.default(dy, [1, 0]), x)
        h = A.mm.default(x, w)
        return dw, h, A.relu.default(h)
    ins = [dy, x, w]
    k = compiled_against_f64(f, ins)
    heads = re.findall(r"/\* k\d+: (.*?) \*/", k.source)
    # dW's GEMM alone; h's GEMM, then one kernel for h's copy and the relu
    assert heads == ["extern gemm [40 x 24 x 48] x 1", "extern gemm [48 x 40 x 24] x 1",
                     "pointwise over [48, 40], 1 loop"], heads


def prefetches(source):
    """The next-row prefetch loops of generated source: (row guard, buffer,
    index) of each __builtin_prefetch."""
    return re.findall(r"if \((i\d+ \+ \d+ < \d+)\) \{\n(?:\s+for \(int64_t i\d+q = .*\n"
                      r"\s+__builtin_prefetch\(&b\d+\[.*\]\);\n)+", source), \
        re.findall(r"__builtin_prefetch\(&(b\d+)\[(.*)\]\);", source)


def test_row_kernels_prefetch_the_next_row(tmp_path):
    """Softmax, log-softmax and layer norm over long rows: the first
    reduction over a row reads it from memory, the second from cache, and
    the second's loop touches the next row's cache lines first
    (__builtin_prefetch of the first row at least 4 KB on, guarded by the
    row loop), so memory works while the later passes compute. Masked
    attention scores (1 KB rows: 4 rows on) prefetch their mask's rows
    too. Rows read at a stride, or shorter than
    4 lines, prefetch nothing. Loops still vector code; fresh inputs
    (non-contiguous and broadcast ones among them), against float64."""
    g = torch.Generator().manual_seed(SEED)
    R, C = 64, 1000
    x = torch.randn(R, C, generator=g) * 4
    for f in (lambda x: (A._softmax.default(x, -1, False),), lambda x: (A._log_softmax.default(x, -1, False),)):
        k = compiled_against_f64(f, [x])
        guards, streams = prefetches(k.source)
        assert guards == [f"i0 + 2 < {R}"] and len(streams) == 1, k.source   # 4000-byte rows
        assert re.fullmatch(rf"{2 * C} \+ {C} \* i0 \+ i\d+q", streams[0][1]), streams
        assert_vector_code(tmp_path, k.source)

    w, b = torch.randn(2048, generator=g), torch.randn(2048, generator=g)
    y = torch.randn(48, 2048, generator=g) * 2 + 1

    def layer_norm(y, w, b):
        return (A.native_layer_norm.default(y, [2048], w, b, 1e-5)[0],)
    k = compiled_against_f64(layer_norm, [y, w, b])
    guards, streams = prefetches(k.source)
    assert guards == ["i0 + 1 < 48"] and [s[1].split(" + i")[0] for s in streams] == ["2048 + 2048 * i0"], k.source
    assert_vector_code(tmp_path, k.source)

    # masked attention scores [B, H, S, S] and a broadcast mask [S, S]
    # (bool: 4 lines a row)
    S = 256
    s = torch.randn(2, 4, S, S, generator=g)
    m = torch.rand(S, S, generator=g) > 0.2
    m[:, 0] = True    # no row fully masked

    def masked(s, m):
        return (torch.softmax((s * 0.125).masked_fill(~m, float("-inf")), -1),)
    k = tk.compile_fx(tk.aten_graph(masked, [s, m]), [s, m], keep_source=True)
    torch.testing.assert_close(k(s, m)[0].double(), masked(s.double(), m)[0], rtol=1e-4, atol=1e-6)
    guards, streams = prefetches(k.source)
    assert guards == [f"i2 + 4 < {S}"] and len(streams) == 2, k.source
    assert sorted(re.sub(r"i\d+q", "q", st[1]) for st in streams) == \
        sorted([f"{4 * S} + {S * S * 4} * i0 + {S * S} * i1 + {S} * i2 + q", f"{4 * S} + {S} * i2 + q"]), streams
    assert_vector_code(tmp_path, k.source)

    # rms norm: one reduction, then the element loop in blocks, each
    # touching the next row's block first
    def rms(y, w):
        return (A.mul.Tensor(A.mul.Tensor(y, A.rsqrt.default(A.add.Tensor(
            A.mean.dim(A.mul.Tensor(y, y), [-1], True), 1e-6))), w),)
    k = compiled_against_f64(rms, [y, w])
    guards, streams = prefetches(k.source)
    assert guards == ["i0 + 1 < 48"] and len(streams) == 1, k.source
    assert re.search(r"for \(int64_t i(\d+)b = 0;.*\n.*\n\s+if \(i0 \+ 1 < 48\)(.*\n){4}"
                     r"\s+#pragma omp simd.*\n\s+for \(int64_t i\1 = i\1b; i\1 < i\1e;", k.source), k.source
    assert_vector_code(tmp_path, k.source)

    # rows read at a stride of 2, rows of 3 lines: nothing to prefetch
    for z in (torch.randn(R, 2 * C, generator=g)[:, ::2], torch.randn(4096, 48, generator=g)):
        k = compiled_against_f64(lambda z: (A._softmax.default(z, -1, False),), [z])
        assert prefetches(k.source) == ([], []), k.source


def store_prefetches(source):
    """The stores' prefetches of generated source (__builtin_prefetch for
    writing): (buffer, index) of each."""
    return re.findall(r"__builtin_prefetch\(&(b\d+)\[(.*)\], 1, 3\);", source)


def test_row_kernels_prefetch_their_stores(tmp_path):
    """A row kernel whose element loop is the first to write its output
    row (log-softmax, layer norm, rms norm) touches that row's lines for
    writing in the pass before it, a block at a time, so the stores' reads
    for ownership do not stall the last pass. A softmax's output row is
    first written by its sum's loop: no store prefetch. Loops still
    vector code; fresh inputs (a strided and a broadcast one among them),
    against float64."""
    g = torch.Generator().manual_seed(SEED)
    R, C = 48, 2048
    w, b = torch.randn(C, generator=g), torch.randn(C, generator=g)

    def log_softmax(x):
        return (A._log_softmax.default(x, -1, False),)

    def layer_norm(y, w, b):
        return (A.native_layer_norm.default(y, [C], w, b, 1e-5)[0],)

    def rms(y, w):
        return (A.mul.Tensor(A.mul.Tensor(y, A.rsqrt.default(A.add.Tensor(
            A.mean.dim(A.mul.Tensor(y, y), [-1], True), 1e-6))), w),)
    x = torch.randn(R, C, generator=g) * 3 + 1
    for f, ins, carrier in ((log_softmax, [x], r"float a\d+p = 0;"),
                            (layer_norm, [x, w, b], r"a\d+q\[i\d+l\] \+= t\d+;"),
                            (rms, [x, w[None, :].expand(R, C)], r"a\d+q\[i\d+l\] \+= t\d+;")):
        k = compiled_against_f64(f, ins)
        stores = store_prefetches(k.source)
        out = re.search(r"\n\s+float \*restrict (b\d+) = ", k.source).group(1)
        assert len(stores) == 1 and stores[0][0] == out, k.source
        assert re.fullmatch(rf"0 \+ {C} \* i0 \+ i(\d+)q", stores[0][1]), stores
        v = re.fullmatch(rf"0 \+ {C} \* i0 \+ i(\d+)q", stores[0][1]).group(1)
        # in a block of the pass before the element loop, whose loop
        # (i<v>) it follows
        body = k.source[k.source.index(f"for (int64_t i{v}b = 0;"):]
        prefetch_at = body.index(", 1, 3);")
        assert re.search(carrier, body[prefetch_at:]), body
        assert prefetch_at < body.index(f"{out}[0 + {C} * i0 + 1 * i"), body   # the element loop's store
        assert body.index(f"for (int64_t i{v}q = i{v}b; i{v}q < i{v}e; i{v}q += 16)") < prefetch_at, body
        assert_vector_code(tmp_path, k.source)
    # the strided row (every second column): a row read at a stride has no
    # next-row prefetch to ride along, and so no store prefetch either
    z = torch.randn(R, 2 * C, generator=g)[:, ::2]
    k = compiled_against_f64(log_softmax, [z])
    assert store_prefetches(k.source) == [], k.source
    k = compiled_against_f64(lambda x: (A._softmax.default(x, -1, False),), [x])
    assert prefetches(k.source)[1] and store_prefetches(k.source) == [], k.source


@pytest.mark.parametrize("rows", [4096, 4])
def test_residual_stream_is_stored_not_recomputed_by_every_norm(rows):
    """A pre-LN transformer's residual stream, x + y1 + y2 + ...: each
    partial sum is read by the next layer norm and by the next addition.
    A producer of at least TCC_STREAM_MIN_ELEMENTS read by several
    kernels is recomputed only while it streams at most two full-size
    buffers, so no norm reads more than a few of the [rows, D] buffers
    (before, the last of 12 read all 13); a decode step's few rows stay
    in cache and keep the sum inlined (no kernel of its own). Both match
    float64."""
    L, R, D = 12, rows, 256
    ins = ([torch.randn(R, D)] + [torch.randn(D, D) * 0.05 for _ in range(L)]
           + [torch.randn(D) for _ in range(L)])

    def f(x, *wb):
        for w, b in zip(wb[:L], wb[L:]):
            x = x + (A.layer_norm.default(x, [D]) @ w + b)
        return (A.layer_norm.default(x, [D]),)

    gm = tk.aten_graph(f, ins)
    k = tk.compile_fx(gm, ins, keep_source=True)
    want = f(*[a.double() for a in ins])[0]
    torch.testing.assert_close(k(*ins)[0].double(), want, rtol=1e-4, atol=1e-4)
    norms = re.findall(r"\n/\* (k\d+): reduction over \[%d, 256\]" % R, k.source)
    assert len(norms) == L + 1, k.kinds
    if R * D < (1 << 20):
        assert "pointwise" not in k.kinds, k.kinds
        return
    assert k.kinds.count("pointwise") >= L // 2 - 1, k.kinds
    for kn in norms:
        text = tk.kernel_text(k.source, kn + r": ")
        rows_read = set(re.findall(r"\b(b\d+)\[0 \+ 256 \* i0 \+", text))   # [R, D] buffers read by row
        assert 1 <= len(rows_read) <= 3, (kn, sorted(rows_read), text[:3000])
