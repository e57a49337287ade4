"""Every op of the compiler's table against PyTorch eager, on fresh random
inputs (seed printed; TCC_TEST_SEED replays), across dtypes, broadcast
shapes and non-contiguous layouts (transposed, sliced with a storage
offset, expanded). Kernels are compiled by the library itself
(tcc-compile-file) and called through ctypes.

Tolerances (|got - want| <= atol + rtol * |want|, NaNs equal):
  float64 1e-10/1e-12, float32 1e-5/1e-5 (reductions over rows 1e-4),
  float16 2e-3/2e-3, bfloat16 1.6e-2/1e-2, integers and bool exact.
"""
import os
import re
import subprocess
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))
import tcckern as tk  # noqa: E402
from tccd._proto import tcc_pb2 as pb  # noqa: E402

A = torch.ops.aten
SEED = int(os.environ.get("TCC_TEST_SEED", time.time_ns() % (1 << 31)))
print(f"test_ops: seed {SEED} (TCC_TEST_SEED={SEED} replays)")

TOL = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1e-2)}
FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8, torch.int16]


def gen(case_seed):
    g = torch.Generator().manual_seed(SEED ^ case_seed)
    return g


def rnd(shape, dtype, g, lo=-3.0, hi=3.0, layout="contig"):
    """A random tensor of `shape` in a given layout (same values whatever
    the layout): contig, t (stored transposed), slice (every other
    element of a bigger buffer, storage offset 3), expand (broadcast from
    size 1 in dim 0)."""
    def values(s):
        if dtype.is_floating_point:
            return (torch.rand(s, generator=g, dtype=torch.float64) * (hi - lo) + lo).to(dtype)
        if dtype == torch.bool:
            return torch.rand(s, generator=g) < 0.5
        l, h = (0, 20) if dtype == torch.uint8 else (int(lo * 3) - 1, int(hi * 3) + 2)
        return torch.randint(l, h, s, generator=g, dtype=torch.int64).to(dtype)
    shape = tuple(shape)
    if layout == "contig" or len(shape) == 0:
        return values(shape)
    if layout == "t":
        base = values(shape[::-1])
        return base.permute(*reversed(range(len(shape))))
    if layout == "slice":
        big = values((shape[0] * 2 + 1,) + shape[1:])
        flat = torch.empty(big.numel() + 3, dtype=dtype)
        flat[3:] = big.reshape(-1)
        return flat[3:].view(big.shape)[1::2]
    if layout == "expand":
        return values((1,) + shape[1:]).expand(shape)
    raise ValueError(layout)


def check(out, want, dtype=None, tol=None):
    dtype = dtype or want.dtype
    if tol is None:
        tol = TOL.get(dtype, (0, 0))
    rtol, atol = tol
    assert out.shape == want.shape, (out.shape, want.shape)
    assert out.dtype == want.dtype, (out.dtype, want.dtype)
    torch.testing.assert_close(out, want, rtol=rtol, atol=atol, equal_nan=True, check_stride=False)


def run_op(op, args, kwargs=None, nout=None, tol=None, take=None):
    kwargs = kwargs or {}
    gm, ins = tk.op_graph(op, args, kwargs, nout, take)
    k = tk.compile_fx(gm, ins)
    outs = k(*ins)
    want = op(*args, **kwargs)
    want = list(want) if nout else [want]
    if take is not None:
        want = [want[i] for i in take]
    for i, (o, w) in enumerate(zip(outs, want)):
        check(o, w, tol=tol)
    return k


# ------------------------------------------------------------ unary

UNARY_FLOAT = ["exp", "exp2", "expm1", "log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal", "sin",
               "cos", "tan", "tanh", "sigmoid", "erf", "silu", "floor", "ceil", "round", "trunc"]
UNARY_ANY = ["abs", "neg", "relu", "sign"]
POSITIVE = {"log", "log1p", "log2", "sqrt", "rsqrt", "reciprocal"}


@pytest.mark.parametrize("name", UNARY_FLOAT + UNARY_ANY)
@pytest.mark.parametrize("dtype", FLOATS)
def test_unary_float(name, dtype):
    g = gen(hash((name, str(dtype))) & 0xffff)
    lo, hi = (0.1, 4.0) if name in POSITIVE else (-4.0, 4.0)
    if name == "tan":
        lo, hi = -1.4, 1.4
    layout = ["contig", "t", "slice", "expand"][hash(name) % 4]
    x = rnd((5, 7), dtype, g, lo, hi, layout)
    run_op(getattr(A, name).default, (x,))


@pytest.mark.parametrize("name", UNARY_ANY + ["bitwise_not", "floor", "trunc"])
@pytest.mark.parametrize("dtype", INTS)
def test_unary_int(name, dtype):
    if dtype == torch.uint8 and name == "neg":
        pytest.skip("neg of uint8 wraps in both; covered by int8")
    g = gen(hash((name, str(dtype))) & 0xffff)
    x = rnd((4, 6), dtype, g, layout="t")
    run_op(getattr(A, name).default, (x,))


@pytest.mark.parametrize("name", ["logical_not", "isnan", "isinf", "bitwise_not", "abs"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_predicates(name, dtype):
    if name == "bitwise_not" and dtype.is_floating_point:
        pytest.skip("bitwise_not of a float raises in PyTorch")
    if name == "abs" and dtype == torch.bool:
        pytest.skip("abs of bool raises in PyTorch")
    g = gen(7)
    x = rnd((6, 5), dtype, g)
    if dtype.is_floating_point:
        x[0, 0] = float("nan")
        x[1, 1] = float("inf")
        x[2, 2] = -float("inf")
        x[3, 3] = 0
    run_op(getattr(A, name).default, (x,))


@pytest.mark.parametrize("approx", ["none", "tanh"])
@pytest.mark.parametrize("dtype", FLOATS)
def test_gelu(approx, dtype):
    x = rnd((8, 9), dtype, gen(11), -5, 5, "slice")
    run_op(A.gelu.default, (x,), {"approximate": approx})
    gout = rnd((8, 9), dtype, gen(12))
    run_op(A.gelu_backward.default, (gout, x), {"approximate": approx},
           tol=(1e-4, 1e-5) if dtype == torch.float32 else None)


def test_special_values():
    x = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 1e-40, -1e30, 88.0, -88.0])
    for name in UNARY_FLOAT + UNARY_ANY:
        if name in POSITIVE or name in ("tan",):
            continue
        run_op(getattr(A, name).default, (x,))


# ----------------------------------------------------------- binary

BINARY = [("add", "Tensor"), ("sub", "Tensor"), ("mul", "Tensor"), ("div", "Tensor"),
          ("maximum", "default"), ("minimum", "default"), ("fmod", "Tensor"),
          ("remainder", "Tensor"), ("atan2", "default"), ("pow", "Tensor_Tensor")]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
SHAPES = [((4, 5), (4, 5)), ((3, 1, 5), (4, 1)), ((), (2, 3)), ((6,), (2, 1, 6))]


@pytest.mark.parametrize("name,ov", BINARY)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.float64, torch.float32),
                                    (torch.float16, torch.float16), (torch.bfloat16, torch.float32),
                                    (torch.int32, torch.float32), (torch.int64, torch.int64),
                                    (torch.int8, torch.uint8)])
@pytest.mark.parametrize("shapes", SHAPES)
def test_binary(name, ov, dtypes, shapes):
    g = gen(hash((name, str(dtypes), shapes)) & 0xffff)
    a = rnd(shapes[0], dtypes[0], g, -3, 3, "t" if len(shapes[0]) > 1 else "contig")
    b = rnd(shapes[1], dtypes[1], g, -3, 3)
    if name in ("fmod", "remainder", "div", "pow") and not (dtypes[0].is_floating_point or dtypes[1].is_floating_point):
        b = torch.where(b == 0, torch.ones_like(b), b)
        if name == "pow":
            b = b.abs() % 4
        if name == "div":
            pytest.skip("true division of ints: covered by float cases")
    if name == "pow" and (dtypes[0].is_floating_point or dtypes[1].is_floating_point):
        a = a.abs() + 0.5 if a.dtype.is_floating_point else a.abs() + 1
    tol = (1e-4, 1e-5) if name == "pow" and torch.float32 in dtypes else None
    run_op(getattr(getattr(A, name), ov), (a, b), tol=tol)


@pytest.mark.parametrize("alpha", [1, 2, -0.5])
def test_add_sub_alpha(alpha):
    a = rnd((3, 4), torch.float32, gen(3))
    b = rnd((4,), torch.float32, gen(4))
    run_op(A.add.Tensor, (a, b), {"alpha": alpha})
    run_op(A.sub.Tensor, (a, b), {"alpha": alpha})
    run_op(A.add.Scalar, (a, 2.5), {"alpha": alpha})
    ai = rnd((3, 4), torch.int64, gen(5))
    run_op(A.add.Tensor, (ai, ai), {"alpha": 3})


@pytest.mark.parametrize("mode", [None, "trunc", "floor"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32, torch.int64, torch.int8])
def test_div_mode(mode, dtype):
    g = gen(21)
    a = rnd((5, 6), dtype, g, -20, 20)
    b = rnd((5, 6), dtype, g, -6, 6)
    b = torch.where(b == 0, torch.full_like(b, 3), b)
    run_op(A.div.Tensor_mode, (a, b), {"rounding_mode": mode})
    run_op(A.div.Scalar_mode, (a, -3), {"rounding_mode": mode})


def test_integer_division_by_zero_is_an_error():
    a = torch.tensor([1, 2, 3])
    b = torch.tensor([1, 0, 2])
    gm, ins = tk.op_graph(A.div.Tensor_mode, (a, b), {"rounding_mode": "floor"})
    k = tk.compile_fx(gm, ins)
    with pytest.raises(RuntimeError):
        k(*ins)


@pytest.mark.parametrize("name", COMPARE)
@pytest.mark.parametrize("dtypes", [(torch.float32, torch.float32), (torch.int64, torch.float32),
                                    (torch.bool, torch.bool), (torch.bfloat16, torch.float16)])
def test_compare(name, dtypes):
    g = gen(hash((name, str(dtypes))) & 0xffff)
    a = rnd((3, 1, 5), dtypes[0], g, -2, 2)
    b = rnd((4, 5), dtypes[1], g, -2, 2)
    if a.dtype.is_floating_point:
        a = a.round()
        b = b.round() if b.dtype.is_floating_point else b
    run_op(getattr(A, name).Tensor, (a, b))
    run_op(getattr(A, name).Scalar, (a, 1))
    run_op(getattr(A, name).Scalar, (a, 0.5))


@pytest.mark.parametrize("name", ["logical_and", "logical_or", "logical_xor"])
def test_logical(name):
    g = gen(31)
    a = rnd((4, 5), torch.float32, g).round()
    b = rnd((5,), torch.bool, g)
    run_op(getattr(A, name).default, (a, b))


@pytest.mark.parametrize("name", ["bitwise_and", "bitwise_or", "bitwise_xor"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.bool, torch.int64])
def test_bitwise(name, dtype):
    g = gen(41)
    a = rnd((4, 5), dtype, g)
    b = rnd((4, 5), dtype, g, layout="t")
    run_op(getattr(A, name).Tensor, (a, b))
    if dtype != torch.bool:
        run_op(getattr(A, name).Scalar, (a, 6))


def test_scalar_forms_and_promotion():
    g = gen(51)
    x = rnd((4, 5), torch.float16, g)
    i = rnd((4, 5), torch.int32, g)
    for op, s in [(A.add.Scalar, 2), (A.sub.Scalar, 1.5), (A.mul.Scalar, 3), (A.div.Scalar, 4),
                  (A.pow.Tensor_Scalar, 2), (A.fmod.Scalar, 1.5), (A.remainder.Scalar, 2),
                  (A.clamp_min.default, -1), (A.clamp_max.default, 0.5)]:
        run_op(op, (x, s))
        run_op(op, (i, s) if op not in (A.fmod.Scalar, A.remainder.Scalar) else (i, 3))
    run_op(A.pow.Scalar, (2.0, x))
    z = torch.tensor(2.5, dtype=torch.float64)   # zero-dim does not promote
    run_op(A.mul.Tensor, (x, z))
    run_op(A.add.Tensor, (i, z))


@pytest.mark.parametrize("exponent", [2, 3, -2, 0.5, -0.5, -1, 2.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_pow_by_constant_exponent(exponent, dtype):
    """x ** c with the exponents ATen's CPU pow computes without pow()
    (2, 3, -2 by multiplying; 0.5, -0.5, -1 as sqrt, rsqrt, reciprocal)
    is lowered the same way, so no pow call is left to keep the loop
    scalar (GPT-2's tanh GELU cubes its input); 2.5 still calls pow. The
    multiplications and the reciprocal match eager bit for bit in float32
    and float64 (-0 and inf included); sqrt and rsqrt within TOL (torch's
    vector sqrt is not correctly rounded: 1 ulp off on ~0.8% of inputs).
    Fresh inputs, negative ones for the integer exponents."""
    g = gen(hash(("pow", exponent, str(dtype))) & 0xffff)
    lo = -3.0 if exponent in (2, 3, -2, -1, 2.5) else 0.05
    x = rnd((6, 37), dtype, g, lo, 3.0, layout="slice")
    x[0, :3] = torch.tensor([float("inf"), -0.0, 0.0], dtype=dtype)
    gm, ins = tk.op_graph(A.pow.Tensor_Scalar, (x, exponent), {}, None, None)
    k = tk.compile_fx(gm, ins, keep_source=True)
    calls_pow = re.search(r"\bpowf?\(", k.source.split("tcc_pow_i64")[-1]) is not None
    assert calls_pow == (exponent == 2.5), k.source[-1500:]
    got, want = k(*ins)[0], A.pow.Tensor_Scalar(x, exponent)
    if dtype == torch.bfloat16 or exponent in (0.5, -0.5, 2.5):
        check(got, want)
    else:
        bad = (got != want) | (torch.signbit(got) != torch.signbit(want))
        assert not bad.any(), (x[bad], got[bad], want[bad])


def test_where_and_clamp():
    g = gen(61)
    c = rnd((4, 1), torch.bool, g)
    a = rnd((4, 5), torch.float32, g)
    b = rnd((5,), torch.float64, g)
    run_op(A.where.self, (c, a, b))
    run_op(A.where.ScalarSelf, (c, 1.5, a))
    run_op(A.where.ScalarOther, (c, a, 0))
    run_op(A.where.Scalar, (c, 1.0, 0.0))
    run_op(A.clamp.default, (a, -1, 1))
    run_op(A.clamp.default, (a, None, 0.2))
    run_op(A.clamp.Tensor, (a, b, None))
    run_op(A.clamp_min.Tensor, (a, b))
    run_op(A.clamp_max.Tensor, (a, b))
    ai = rnd((4, 5), torch.int64, g)
    run_op(A.clamp.default, (ai, -2, 3))


@pytest.mark.parametrize("src", FLOATS + INTS + [torch.bool])
@pytest.mark.parametrize("dst", FLOATS + INTS + [torch.bool])
def test_to_copy(src, dst):
    g = gen(hash((str(src), str(dst))) & 0xffff)
    lo, hi = (0, 100) if dst == torch.uint8 or src == torch.uint8 else (-100, 100)
    if dst in (torch.int8,):
        lo, hi = -100, 100
    x = rnd((3, 7), src, g, lo, hi, "slice")
    if src.is_floating_point and not dst.is_floating_point and dst != torch.bool:
        x = x.trunc()   # float->int of fractions is exact either way; keep in range
        if dst == torch.int8:
            x = x.clamp(-120, 120)
        if dst == torch.uint8:
            x = x.clamp(0, 250)
    run_op(A._to_copy.default, (x,), {"dtype": dst})


def test_clone_and_copies():
    x = rnd((4, 6), torch.float32, gen(71), layout="t")
    run_op(A.clone.default, (x,))
    run_op(A.lift_fresh_copy.default, (x,))
    run_op(A.dropout.default, (x, 0.3, False))


def test_backward_pointwise():
    g = gen(81)
    go = rnd((5, 6), torch.float32, g)
    x = rnd((5, 6), torch.float32, g)
    run_op(A.threshold_backward.default, (go, x, 0.0))
    y = torch.sigmoid(x)
    run_op(A.sigmoid_backward.default, (go, y))
    run_op(A.tanh_backward.default, (go, torch.tanh(x)))


# ------------------------------------------------------------ views

VIEW_CASES = [
    (A.view.default, lambda x: (x, [6, 4])),
    (A.view.default, lambda x: (x, [-1])),
    (A._unsafe_view.default, lambda x: (x, [2, 3, 4])),
    (A.reshape.default, lambda x: (x, [3, 8])),
    (A.permute.default, lambda x: (x, [1, 0])),
    (A.transpose.int, lambda x: (x, 0, -1)),
    (A.t.default, lambda x: (x,)),
    (A.expand.default, lambda x: (x.reshape(4, 1, 6), [4, 5, 6])),
    (A.expand.default, lambda x: (x, [2, 4, 6])),
    (A.squeeze.default, lambda x: (x.reshape(4, 1, 6),)),
    (A.squeeze.dim, lambda x: (x.reshape(1, 4, 6), 0)),
    (A.squeeze.dims, lambda x: (x.reshape(1, 4, 1, 6), [0, 2])),
    (A.unsqueeze.default, lambda x: (x, 1)),
    (A.unsqueeze.default, lambda x: (x, -1)),
    (A.slice.Tensor, lambda x: (x, 1, 1, 5, 2)),
    (A.slice.Tensor, lambda x: (x, 0, -3, None)),
    (A.slice.Tensor, lambda x: (x, 1, 0, 100)),
    (A.select.int, lambda x: (x, 0, -1)),
    (A.select.int, lambda x: (x, 1, 2)),
    (A.alias.default, lambda x: (x,)),
]


@pytest.mark.parametrize("i", range(len(VIEW_CASES)))
@pytest.mark.parametrize("layout", ["contig", "t", "slice"])
def test_views(i, layout):
    op, mk = VIEW_CASES[i]
    x = rnd((4, 6), torch.float32, gen(i), layout=layout)
    args = mk(x)
    if op in (A.view.default, A._unsafe_view.default) and not args[0].is_contiguous():
        pytest.skip("view of a non-viewable layout raises in PyTorch")
    run_op(op, args)


def test_view_chain_feeds_pointwise():
    x = rnd((2, 3, 4), torch.float32, gen(91), layout="slice")
    def f(x):
        y = A.permute.default(x, [2, 0, 1])              # [4, 2, 3]
        y = A.slice.Tensor(y, 0, 1, 4)                   # [3, 2, 3]
        y = A.select.int(y, 1, 1)                        # [3, 3]
        y = A.expand.default(A.unsqueeze.default(y, 0), [2, 3, 3])
        y = A.mul.Tensor(A.transpose.int(y, 1, 2), 2.0)
        return A.add.Tensor(A.view.default(A.clone.default(y), [6, 3]), 1)
    gm = tk.aten_graph(f, [x], decompose=False)
    k = tk.compile_fx(gm, [x])
    check(k(x)[0], f(x))


def test_as_strided():
    base = rnd((24,), torch.float32, gen(92))
    run_op(A.as_strided.default, (base, [3, 4], [1, 3], 2))
    run_op(A.as_strided.default, (base, [2, 2, 3], [8, 0, 2]))


AS_STRIDED_CASES = [              # (sizes of x, view sizes, strides, storage offset)
    ((4, 6), [3, 4], [1, 3], 2),            # transposed read, offset
    ((4, 6), [2, 2, 3], [8, 0, 2], None),   # overlapping (stride 0)
    ((24,), [4, 6], [6, 1], 0),             # a reshape of a 1-D value
    ((8, 32, 1, 1), [8, 32, 1, 1], [32, 1, 32, 32], None),   # channels_last restride
    ((2, 3, 4), [4, 3], [1, 4], 12),        # the second half, column-major
]


@pytest.mark.parametrize("i", range(len(AS_STRIDED_CASES)))
def test_as_strided_of_computed_value(i):
    """as_strided over a value computed in the kernel reads its row-major
    flattening -- eager's storage of that fresh tensor (x is contiguous, so
    eager's mul result is too; the backend sends no other)."""
    xs, size, stride, off = AS_STRIDED_CASES[i]
    x = rnd(xs, torch.float32, gen(93 + i))

    def f(x):
        return A.add.Tensor(A.as_strided.default(A.mul.Tensor(x, 2.0), size, stride, off), 1)
    gm = tk.aten_graph(f, [x], decompose=False)
    check(tk.compile_fx(gm, [x])(x)[0], f(x))


def test_as_strided_past_a_computed_value_is_invalid():
    x = rnd((4, 6), torch.float32, gen(98))
    g = torch.fx.Graph()
    p = g.placeholder("x")
    y = g.call_function(A.mul.Tensor, (p, 2.0))
    g.output((g.call_function(A.as_strided.default, (y, [4, 6], [6, 1], 1)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)
    for n, v in zip(gm.graph.nodes, [x, x * 2, x.reshape(-1)[:24].reshape(4, 6)]):
        n.meta["val"] = v
    with pytest.raises(tk.CompileError) as e:
        tk.compile_fx(gm, [x])
    assert e.value.code == -3 and "as_strided reaches element 24" in e.value.message


SCATTER_CASES = [              # (base sizes, view sizes, strides, storage offset)
    ((256,), [8, 32], [32, 1], 0),          # the whole base (a channels_last backward)
    ((4, 6), [2, 5], [5, 1], 7),            # one block inside, offset
    ((3, 8), [16], [1], None),              # the first two thirds, 1-D
    ((2, 3, 4), [3, 1, 4], [4, 4, 1], 12),  # the second half, size-1 dim
]


@pytest.mark.parametrize("computed", [True, False], ids=["computed", "input"])
@pytest.mark.parametrize("i", range(len(SCATTER_CASES)))
def test_as_strided_scatter(i, computed):
    bs, size, stride, off = SCATTER_CASES[i]
    g = gen(110 + i)
    base = rnd(bs, torch.float32, g)
    src = rnd(size, torch.float64, g, layout="t")

    def f(base, src):
        if computed:
            base = A.mul.Tensor(base, 3.0)
        return A.as_strided_scatter.default(base, A.add.Tensor(src, 1), size, stride, off)
    gm = tk.aten_graph(f, [base, src], decompose=False)
    check(tk.compile_fx(gm, [base, src])(base, src)[0], f(base, src))


def test_as_strided_scatter_refusals():
    """Scatters tccd does not compile are UNIMPLEMENTED, naming what."""
    g = gen(120)
    base, src = rnd((4, 6), torch.float32, g, layout="t"), rnd((2, 3), torch.float32, g)
    gm, ins = tk.op_graph(A.as_strided_scatter.default, (base, src, [2, 3], [3, 1], 0))
    with pytest.raises(tk.CompileError) as e:
        tk.compile_fx(gm, ins)
    assert e.value.code == -12 and "non-contiguous input" in e.value.message
    base = rnd((4, 6), torch.float32, g)
    gm, ins = tk.op_graph(A.as_strided_scatter.default, (base, src, [2, 3], [1, 2], 0))
    with pytest.raises(tk.CompileError) as e:
        tk.compile_fx(gm, ins)
    assert e.value.code == -12 and "row-major block" in e.value.message


@pytest.mark.parametrize("case", ["same", "broadcast", "dtype"])
def test_copy(case):
    g = gen(130)
    self_ = rnd((3, 4, 5), torch.float32, g, layout="t")
    src = {"same": rnd((3, 4, 5), torch.float32, g, layout="slice"),
           "broadcast": rnd((4, 1), torch.float32, g),
           "dtype": rnd((3, 4, 5), torch.float64, g)}[case]
    run_op(A.copy.default, (self_, src))


POOL_CASES = [     # (input sizes, kernel, stride, padding, dilation, ceil_mode)
    ((2, 3, 9, 9), [3, 3], [2, 2], [1, 1], [1, 1], False),   # ResNet's stem
    ((2, 3, 8, 8), [2], [], [0], [1], False),                  # 2x2, stride = kernel
    ((3, 10, 7), [3, 2], [2, 1], [1, 0], [2, 1], True),        # unbatched, dilated, ceil
    ((1, 2, 5, 6), [2, 3], [3, 2], [1, 1], [1, 1], True),      # ceil_mode's last window
    ((2, 2, 7, 7), [3, 3], [1, 1], [1, 1], [1, 1], False),     # overlapping windows
]


def _run_backward(op, args):
    """A pooling backward against eager -- for bfloat16 against float64
    rounded once: eager adds overlapping windows' shares in bfloat16, one
    rounding per add, where the kernel adds in float32."""
    if args[0].dtype != torch.bfloat16:
        return run_op(op, args)
    gm, ins = tk.op_graph(op, args)
    out = tk.compile_fx(gm, ins)(*ins)[0]
    wide = [a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args]
    check(out, op(*wide).to(torch.bfloat16))


def _pool_input(i, dtype, layout, special=False):
    sizes = POOL_CASES[i][0]
    x = rnd(sizes, dtype, gen(140 + i))
    if special:       # NaNs (two in one window) and windows of -inf only
        x[..., 0, 0] = float("nan")
        x[..., 0, 1] = float("nan")
        x[..., -1, :] = float("-inf")
        x[..., -2, :] = float("-inf")
    if layout == "channels_last" and len(sizes) == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


@pytest.mark.parametrize("layout", ["contig", "channels_last"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("i", range(len(POOL_CASES)))
def test_max_pool2d(i, dtype, layout):
    """Values and indices (exact: eager's tap) forward, the gradient
    backward (through eager's indices)."""
    _, k, st, pad, dil, ceil = POOL_CASES[i]
    for special in (False, True):
        x = _pool_input(i, dtype, layout, special)
        run_op(A.max_pool2d_with_indices.default, (x, k, st, pad, dil, ceil), nout=2)
        y, idx = A.max_pool2d_with_indices.default(x, k, st, pad, dil, ceil)
        gy = rnd(y.shape, dtype, gen(150 + i))
        _run_backward(A.max_pool2d_with_indices_backward.default, (gy, x, k, st, pad, dil, ceil, idx))


def test_pooling_windows_unroll_in_a_simd_element_loop():
    """The stem's 3x3 stride-2 max pool of a ResNet, forward (values and
    indices) and backward (2x2 candidate windows per input element):
    window loops of at most 16 steps unroll and the element loop runs in
    SIMD lanes (cpu/schedule.c, windows). Eager's values and indices
    exactly; the gradient against float64."""
    g = gen(177)
    x = rnd((2, 5, 17, 19), torch.float32, g)
    args = (x, [3, 3], [2, 2], [1, 1], [1, 1], False)
    gm, ins = tk.op_graph(A.max_pool2d_with_indices.default, args, nout=2)
    k = tk.compile_fx(gm, ins, keep_source=True)
    y, idx = A.max_pool2d_with_indices.default(*args)
    got = k(*ins)
    assert torch.equal(got[0], y) and torch.equal(got[1], idx)
    gy = rnd(y.shape, torch.float32, g)
    bargs = (gy, x, [3, 3], [2, 2], [1, 1], [1, 1], False, idx)
    gm, ins = tk.op_graph(A.max_pool2d_with_indices_backward.default, bargs)
    kb = tk.compile_fx(gm, ins, keep_source=True)
    for src in (k.source, kb.source):
        body = src[src.index("TCC_BODY int tcc_b"):]
        assert re.search(r"#pragma omp simd reduction\(\|:bad\)\n\s+for \(int64_t i3 = 0", body), body[:3000]
        assert "#pragma GCC unroll 16" in body, body[:3000]
    want = A.max_pool2d_with_indices_backward.default(gy.double(), x.double(), *bargs[2:])
    torch.testing.assert_close(kb(*ins)[0].double(), want, rtol=1e-6, atol=1e-6)


def test_window_kernel_follows_a_channels_last_store():
    """A pooling kernel that writes NHWC loops C innermost (unit stride),
    and still gives eager's values and indices."""
    x = _pool_input(0, torch.float32, "channels_last")
    k, st, pad, dil, ceil = POOL_CASES[0][1:]
    gm, ins = tk.op_graph(A.max_pool2d_with_indices.default, (x, k, st, pad, dil, ceil), nout=2)
    req = tk.request_for(gm, ins)
    for name in req.graph.outputs:                      # declare both outputs NHWC
        meta = next(v.meta for v in req.graph.values if v.name == name)
        n, c, h, w = meta.sizes
        del meta.strides[:]
        meta.strides.extend([h * w * c, 1, w * c, c])
    kern = tk.compile_request(req, keep_source=True)
    src = kern.source[kern.source.index("/* k0"):]
    assert src.index("for (int64_t i1 ") > src.index("for (int64_t i3 "), src[:600]
    for got, want in zip(kern(*ins), A.max_pool2d_with_indices.default(x, k, st, pad, dil, ceil)):
        check(got, want)


AVG_OPTIONS = [(True, None), (False, None), (True, 5)]   # (count_include_pad, divisor_override)


@pytest.mark.parametrize("opt", range(len(AVG_OPTIONS)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("i", range(len(POOL_CASES)))
def test_avg_pool2d(i, dtype, opt):
    sizes, k, st, pad, _, ceil = POOL_CASES[i]
    inc, div = AVG_OPTIONS[opt]
    x = _pool_input(i, dtype, "channels_last" if opt == 1 else "contig")
    args = (k, st, pad, ceil, inc, div)
    run_op(A.avg_pool2d.default, (x,) + args)
    gy = rnd(A.avg_pool2d.default(x, *args).shape, dtype, gen(160 + i))
    _run_backward(A.avg_pool2d_backward.default, (gy, x) + args)


ADAPTIVE_CASES = [((2, 3, 8, 8), (4, 4)), ((2, 3, 7, 9), (4, 4)), ((3, 5, 13), (3, 5)), ((1, 2, 5, 5), (3, 3)),
                  ((2, 4, 6, 6), (1, 1)), ((1, 2, 3, 3), (5, 7)), ((2, 3, 7, 7), (7, 7))]


@pytest.mark.parametrize("i", range(len(ADAPTIVE_CASES)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_adaptive_avg_pool2d(i, dtype):
    """_adaptive_avg_pool2d and its backward against eager: windows that
    divide evenly (8 -> 4), that overlap and differ in size (7 -> 4, 5 ->
    3), an output larger than the input (3 -> 5, 7), 3-D input, global
    pooling, channels_last."""
    sizes, out = ADAPTIVE_CASES[i]
    x = rnd(sizes, dtype, gen(180 + i))
    if i == 1:
        x = x.contiguous(memory_format=torch.channels_last)
    run_op(A._adaptive_avg_pool2d.default, (x, list(out)))
    gy = rnd(A._adaptive_avg_pool2d.default(x, list(out)).shape, dtype, gen(190 + i))
    _run_backward(A._adaptive_avg_pool2d_backward.default, (gy, x))


def test_pool_refusals():
    """What eager refuses is INVALID_ARGUMENT naming it (requests edited
    after tracing: eager would not trace them); integer inputs are
    UNIMPLEMENTED."""
    x = rnd((1, 2, 6, 6), torch.float32, gen(170))
    gm, ins = tk.op_graph(A.avg_pool2d.default, (x, [3, 3], [2, 2], [1, 1]))
    for arg, ints, msg in [("padding", [2, 2], "at most half of effective kernel size"),
                           ("kernel_size", [0, 3], "kernel size should be greater than zero"),
                           ("stride", [1, 0], "stride should be greater than zero")]:
        req = tk.request_for(gm, ins)
        for a in req.graph.nodes[0].inputs:
            if a.name == arg:
                del a.arg.as_ints.values[:]
                a.arg.as_ints.values.extend(ints)
        with pytest.raises(tk.CompileError) as e:
            tk.compile_request(req)
        assert e.value.code == -3 and msg in e.value.message, str(e.value)
    xi = torch.randint(0, 9, (1, 2, 6, 6))
    gm, ins = tk.op_graph(A.avg_pool2d.default, (xi.double(), [2, 2]))
    req = tk.request_for(gm, ins)
    for v in req.graph.values:
        v.meta.dtype = pb.INT64
    with pytest.raises(tk.CompileError) as e:
        tk.compile_request(req)
    assert e.value.code == -12 and "int64 input" in e.value.message, str(e.value)


def test_cat_pad_index():
    g = gen(101)
    a = rnd((2, 3), torch.float32, g)
    b = rnd((2, 5), torch.float64, g, layout="slice")
    c = rnd((2, 1), torch.float32, g)
    run_op(A.cat.default, ([a, b, c], 1))
    run_op(A.cat.default, ([a, a], 0))
    run_op(A.cat.default, ([a, torch.empty(0), a], -1))
    x = rnd((3, 4), torch.float32, g, layout="t")
    run_op(A.constant_pad_nd.default, (x, [1, 2]))
    run_op(A.constant_pad_nd.default, (x, [0, 1, 2, 0], 1.5))
    run_op(A.constant_pad_nd.default, (x, [-1, 1]))
    idx = torch.tensor([2, 0, 2, 1])
    run_op(A.index_select.default, (x, 0, idx))
    run_op(A.index_select.default, (x, 1, idx.to(torch.int32)))
    gi = torch.randint(0, 4, (3, 5), generator=g)
    run_op(A.gather.default, (x, 1, gi))
    gi0 = torch.randint(0, 3, (2, 4), generator=g)
    run_op(A.gather.default, (x, 0, gi0))
    w = rnd((10, 6), torch.float32, g)
    ids = torch.randint(0, 10, (4, 7), generator=g)
    run_op(A.embedding.default, (w, ids))


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool])
def test_cat_random(dtype, seed):
    """Concatenations of random rank, dim, input count (1-12, some empty
    along the dim) and layouts, alone and nested, some large enough for
    the parallel loop: the CPU schedule runs the concatenated dim's loop
    in ranges (one per input, cpu/schedule.c) or keeps the selects (more
    ranges than it takes); either way eager's values exactly."""
    g = gen(4001 + seed * 7 + [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool].index(dtype))
    rank = 1 + int(torch.randint(0, 4, (), generator=g))
    shape = [1 + int(torch.randint(0, 5, (), generator=g)) for _ in range(rank)]
    if seed >= 4:
        shape[0] = 64 * (seed - 3)   # past the parallel loop's threshold
    dim = int(torch.randint(-rank, rank, (), generator=g))
    n = 1 + int(torch.randint(0, 12, (), generator=g))
    parts = []
    for j in range(n):
        sz = list(shape)
        sz[dim] = int(torch.randint(0, 4, (), generator=g))
        layout = ["contig", "t", "slice", "expand"][int(torch.randint(0, 4, (), generator=g))]
        if layout != "contig" and (rank < 2 or 0 in sz or (layout == "expand" and dim % rank == 0)):
            layout = "contig"
        parts.append(rnd(sz, dtype, g, layout=layout))
    if all(p.shape[dim] == 0 for p in parts):
        parts[0] = rnd(shape, dtype, g)
    run_op(A.cat.default, (parts, dim))
    half = max(1, n // 2)

    def nested(*t):
        return (A.cat.default([A.cat.default(list(t[:half]), dim)] + list(t[half:]), dim),)
    gm = tk.aten_graph(nested, parts, decompose=False)
    check(tk.compile_fx(gm, parts)(*parts)[0], nested(*parts)[0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bool, torch.int64])
def test_advanced_index(dtype):
    """aten.index.Tensor: index tensors in adjacent dims (None before them),
    broadcasting, negative indices, int32/int64, non-contiguous self."""
    g = gen(211 + FLOATS.index(dtype) if dtype in FLOATS else 233)
    x = rnd((5, 6, 7), dtype, g, layout="t")
    i = torch.randint(-5, 5, (4,), generator=g)
    j = torch.randint(0, 6, (3,), generator=g)
    k = torch.randint(-7, 7, (2, 1, 3), generator=g)
    run_op(A.index.Tensor, (x, [i]))
    run_op(A.index.Tensor, (x, [None, j]))
    run_op(A.index.Tensor, (x, [None, None, k]))
    run_op(A.index.Tensor, (x, [i.view(4, 1), j.view(1, 3).to(torch.int32)]))
    run_op(A.index.Tensor, (x, [None, j.view(3, 1), k[0]]))
    run_op(A.index.Tensor, (x, [i.view(2, 2, 1), j[:1], k[0, 0, :1]]))


def test_advanced_index_refusals():
    """Index tensors in dims that are not adjacent are UNIMPLEMENTED naming
    the op (the Python backend runs them eagerly)."""
    x = torch.randn(4, 5, 6)
    i = torch.tensor([0, 2])
    for indices in ([i, None, i],):
        gm, ins = tk.op_graph(A.index.Tensor, (x, indices))
        with pytest.raises(tk.CompileError) as e:
            tk.compile_fx(gm, ins)
        assert e.value.code == -12 and "aten.index.Tensor" in e.value.message, \
            str(e.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int64, torch.bfloat16])
def test_index_put_boolean_mask(dtype):
    """aten.index_put with one boolean mask (over every dim or the leading
    ones) and one value: a select; accumulate adds the value; the value is
    cast to self's dtype first; non-contiguous self and mask."""
    g = gen(307 + (FLOATS.index(dtype) if dtype in FLOATS else 7))
    x = rnd((5, 6, 7), dtype, g, layout="t")
    full = torch.rand(7, 6, 5, generator=g).permute(2, 1, 0) > 0.5
    lead = torch.rand(5, 6, generator=g) > 0.3
    one = torch.tensor(2.75, dtype=torch.float64)
    run_op(A.index_put.default, (x, [full], one.to(dtype)))
    run_op(A.index_put.default, (x, [lead], one.to(dtype).view(1, 1)))
    run_op(A.index_put.default, (x, [full], one.to(dtype), True))
    run_op(A.index_put.default, (x, [lead[:, 0]], one.to(dtype).view(1)))   # mask over dim 0 only


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
def test_index_put_integer_index(dtype):
    """aten.index_put with one 1-D integer index tensor in any position
    (index_copy_, a StaticCache's update): values broadcast to the indexed
    shape; negative indices count from the end; the last of equal indices
    wins; accumulate adds every matching value; int32 indices too."""
    g = gen(331 + (FLOATS.index(dtype) if dtype in FLOATS else 7))
    cache = rnd((2, 3, 16, 4), dtype, g)
    one = torch.tensor([9])
    run_op(A.index_put.default, (cache, [None, None, one], rnd((2, 3, 1, 4), dtype, g)))
    three = torch.tensor([0, -1, 5], dtype=torch.int32)
    run_op(A.index_put.default, (cache, [None, None, three], rnd((3, 4), dtype, g)))   # broadcast
    run_op(A.index_put.default, (cache, [torch.tensor([1, 0])], rnd((2, 3, 16, 4), dtype, g, layout="t")))
    x = rnd((6, 5), dtype, g, layout="t")
    dup = torch.tensor([4, 1, 4])
    v = rnd((3, 5), dtype, g)
    k = tk.compile_fx(*tk.op_graph(A.index_put.default, (x, [dup], v)))
    got = k(x, dup, v)[0]
    want = x.clone()
    want[1], want[4] = v[1], v[2]          # a sequential write: the last 4 wins
    check(got, want)
    run_op(A.index_put.default, (x, [None, torch.tensor([3, 3, 0])], rnd((6, 3), dtype, g), True))


def test_index_put_integer_index_out_of_range_is_an_error():
    """An index outside self's dim is the kernel's error, as eager's."""
    x = torch.randn(4, 5)
    gm, ins = tk.op_graph(A.index_put.default, (x, [None, torch.tensor([2])], torch.randn(4, 1)))
    k = tk.compile_fx(gm, ins)
    with pytest.raises(Exception, match="(?i)index|range|bounds"):
        k(x, torch.tensor([7]), torch.randn(4, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_scatter_value(dtype):
    """aten.scatter.value (the one-hot of nll_loss's backward): value
    written where index says along dim; an index smaller than self in the
    other dims writes only inside its extent; several entries along dim."""
    g = gen(341 + FLOATS.index(dtype))
    x = rnd((8, 10), dtype, g, layout="t")
    t = torch.randint(0, 10, (8, 1), generator=g)
    run_op(A.scatter.value, (x, 1, t, -1.0))
    run_op(A.scatter.value, (x, 1, torch.randint(0, 10, (5, 3), generator=g), 2.5))
    run_op(A.scatter.value, (x, 0, torch.randint(0, 8, (2, 10), generator=g), 0.5))
    run_op(A.scatter.value, (torch.zeros(8, 10, dtype=dtype), 1, t, -1.0))


def test_index_put_refusals():
    """A 2-D index, two index tensors, more positions than a select
    compiles, several values for a mask, or a mask after a None write
    positions a select cannot follow: UNIMPLEMENTED naming the op (they
    run eagerly); a mask whose size differs from self's is
    INVALID_ARGUMENT."""
    x = torch.randn(4, 5)
    m = torch.rand(4, 5) > 0.5
    for args, code in (((x, [torch.tensor([[0, 2]])], torch.tensor(1.0)), -12),
                       ((x, [torch.tensor([0]), torch.tensor([1])], torch.tensor(1.0)), -12),
                       ((torch.randn(20, 3), [torch.arange(9)], torch.tensor(1.0)), -12),
                       ((x, [m], torch.randn(1, 20)), -12),
                       ((x, [None, m[0]], torch.tensor(1.0)), -12),
                       ((x, [m[:3]], torch.tensor(1.0)), -3)):
        try:
            gm, ins = tk.op_graph(A.index_put.default, args)
        except RuntimeError:          # eager itself refuses (the size mismatch)
            assert code == -3
            continue
        with pytest.raises(tk.CompileError) as e:
            tk.compile_fx(gm, ins)
        assert e.value.code == code and "aten.index_put.default" in e.value.message, str(e.value)


def _write_rows_graph(dim, read_twice=False, accumulate=False, self_computed=False, mask=False):
    """cache.index_put_(idx at dim, rows), then the new cache read by a
    pointwise op and a row sum (the attention reading a KV cache after
    its update): (gm, eager function)."""
    def f(cache, idx, rows):
        base = cache * 1.5 if self_computed else cache
        ix = [None] * dim + [idx]
        other = cache.sum() if read_twice else None
        w = A.index_put_.default(base, ix, rows, accumulate)
        outs = (w * 2.0, w.sum(-1))
        return outs + ((other,) if read_twice else ())
    g = torch.fx.Graph()
    c, i, r = g.placeholder("cache"), g.placeholder("idx"), g.placeholder("rows")
    base = g.call_function(A.mul.Tensor, (c, 1.5)) if self_computed else c
    w = g.call_function(A.index_put_.default, (base, [None] * dim + [i], r, accumulate))
    outs = [g.call_function(A.mul.Tensor, (w, 2.0)), g.call_function(A.sum.dim_IntList, (w, [-1]))]
    if read_twice:
        outs.append(g.call_function(A.sum.default, (c,)))
    g.output(tuple(outs))
    return torch.fx.GraphModule(torch.nn.Module(), g), f


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("layout", ["contig", "t"])
def test_index_put_into_an_input(dtype, layout):
    """aten.index_put_ into a graph input (a StaticCache's update, as
    the client's write_in_place sends it): the rows land in the caller's
    tensor, where it lies, and the graph's readers see them; positions not
    written keep their values bit for bit; values broadcast; negative
    indices count from the end; several positions at once."""
    g = gen(351 + FLOATS.index(dtype))
    for dim, idx, rows_shape in ((2, torch.tensor([9]), (2, 3, 1, 4)),
                                 (2, torch.tensor([0, -1, 5]), (3, 4)),           # broadcast rows
                                 (0, torch.tensor([1], dtype=torch.int32), (1, 3, 16, 4))):
        cache = rnd((2, 3, 16, 4), dtype, g, layout=layout)
        rows = rnd(rows_shape, dtype, g)
        gm, f = _write_rows_graph(dim)
        k = tk.compile_fx(gm, [cache, idx, rows])
        want_cache = cache.clone()
        want = f(want_cache, idx, rows)
        got_cache = cache.clone() if layout == "contig" else cache.transpose(-1, -2).clone().transpose(-1, -2)
        assert got_cache.stride() == cache.stride()
        got = k(got_cache, idx, rows)
        assert torch.equal(got_cache, want_cache), (dim, idx)    # a copy, bit for bit
        for o, w in zip(got, want):
            check(o, w)


def test_index_put_into_an_input_out_of_range_writes_nothing():
    """An index outside the cache is the kernel's error, and no row is
    written: not at the bad position's fallback (row 0), nor anywhere."""
    cache = torch.randn(6, 5)
    gm, _ = _write_rows_graph(0)
    k = tk.compile_fx(gm, [cache, torch.tensor([2]), torch.randn(1, 5)])
    before = cache.clone()
    for bad in (torch.tensor([6]), torch.tensor([-7])):
        with pytest.raises(RuntimeError, match="index out of range"):
            k(cache, bad, torch.randn(1, 5))
        assert torch.equal(cache, before)


def test_index_put_into_an_input_refusals():
    """index_put_ compiles only into a graph input read by nothing else
    in the graph, with integer indices and no accumulate; the rest is
    UNIMPLEMENTED naming the op, so the client runs it eagerly."""
    cache, idx, rows = torch.randn(6, 5), torch.tensor([2]), torch.randn(1, 5)
    for kw in (dict(read_twice=True), dict(accumulate=True), dict(self_computed=True)):
        gm, _ = _write_rows_graph(0, **kw)
        with pytest.raises(tk.CompileError) as e:
            tk.compile_fx(gm, [cache, idx, rows])
        assert e.value.code == -12 and "aten.index_put_.default" in e.value.message, (kw, str(e.value))
    gm, ins = tk.op_graph(A.index_put_.default, (cache.clone(), [cache > 0], torch.tensor(1.0)))
    with pytest.raises(tk.CompileError) as e:
        tk.compile_fx(gm, ins)
    assert e.value.code == -12 and "boolean mask" in e.value.message, str(e.value)


@pytest.mark.parametrize("isa", ["x86-64-v3", "x86-64-v4"])
def test_masked_exp_is_inline_and_exact(isa):
    """A float32 exp whose argument holds a constant below -87 (a mask's
    -inf, finfo.min) prints the prelude's tcc_expf_ftz, not libmvec's
    expf (whose vectors leave their fast path on such lanes): under 1 ulp
    against float64 over every range, results below FLT_MIN flushed to
    0, inf, NaN and -inf right. An exp with no such constant keeps expf
    on x86-64-v3 and prints tcc_expf on x86-64-v4 (faster there than
    libmvec's, cpu/schedule.c: plan_inline_exp): under 1 ulp, subnormal
    results within one subnormal step."""
    if isa == "x86-64-v4" and HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    g = gen(401)
    sweep = torch.linspace(-110.0, 95.0, 200003, dtype=torch.float64).float()
    specials = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 88.7228317, 88.7228394,
                             -87.33654, -87.3366, -103.9, -103.972, -103.9721, -104.0, -1e30, 1e30, 1e-30, -1e-30])
    x = torch.cat([sweep, specials, (torch.rand(4096, generator=g, dtype=torch.float64) * 180 - 90).float()])
    keep = torch.rand(x.shape, generator=g) > 0.2
    keep[:sweep.numel() + specials.numel()] = True
    from torch.fx.experimental.proxy_tensor import make_fx

    def check(got, want):
        big = want > torch.finfo(torch.float32).max
        assert torch.equal(torch.isnan(got), torch.isnan(want))
        assert torch.equal(torch.isinf(got), big | torch.isinf(want))
        fin = torch.isfinite(want) & ~big
        ulp = (torch.finfo(torch.float32).eps * want[fin].abs()).clamp(min=2.0 ** -149)
        err = (got[fin] - want[fin]).abs() / ulp
        assert err.max().item() <= 1.0, (err.max().item(), x[fin][err.argmax()].item())

    fn = lambda x, m: torch.exp(torch.where(m, x, float("-inf")))   # noqa: E731
    gm = make_fx(fn)(x, keep)
    k = tk.compile_fx(gm, [x, keep], isa=isa, keep_source=True)
    assert "= tcc_expf_ftz(" in k.source
    want = torch.exp(x.double()).masked_fill(~keep, 0.0)
    check(k(x, keep)[0].double(), torch.where(want < torch.finfo(torch.float32).tiny, 0.0, want))   # flushed
    # no constant below -87 in the argument
    k2 = tk.compile_fx(make_fx(lambda x: torch.exp(x * 0.5))(x), [x], isa=isa, keep_source=True)
    assert ("= tcc_expf(" in k2.source) == (isa == "x86-64-v4") and ("= expf(" in k2.source) == (isa == "x86-64-v3")
    if isa == "x86-64-v4":
        check(k2(x)[0].double(), torch.exp((x * 0.5).double()))


def test_softmax_computes_each_exp_once():
    """Softmax over the innermost dim: the sum's loop keeps each exp(x -
    max) in the output and the element loop divides it there, so the
    source holds one expf (two before); rows with -inf (masked) and an
    all -inf row (NaN, as eager) included; float32 against float64. A
    softmax over an outer dim, and log_softmax, keep their own code."""
    from torch.fx.experimental.proxy_tensor import make_fx
    g = gen(409)
    x = rnd((6, 7, 33), torch.float32, g, -8.0, 8.0)
    x[0, 1, ::3] = float("-inf")
    x[2, 3, :] = float("-inf")
    k = tk.compile_fx(make_fx(lambda x: torch.softmax(x, -1))(x), [x], keep_source=True)
    kernel_body = lambda src: tk.kernel_text(src, "k0: ")   # noqa: E731
    assert kernel_body(k.source).count("expf(") == 1, kernel_body(k.source)
    got = k(x)[0]
    want = torch.softmax(x.double(), -1)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert (got.double()[ok] - want[ok]).abs().max().item() < 1e-6
    masked = make_fx(lambda x, m: torch.softmax(x * 0.125 + m, -1))
    m = torch.where(torch.rand(6, 1, 33, generator=g) > 0.3, 0.0, torch.finfo(torch.float32).min)
    km = tk.compile_fx(masked(x.nan_to_num(neginf=-5.0), m), [x.nan_to_num(neginf=-5.0), m], keep_source=True)
    assert kernel_body(km.source).count("expf(") == 1, kernel_body(km.source)
    check(km(x.nan_to_num(neginf=-5.0), m)[0], torch.softmax(x.nan_to_num(neginf=-5.0) * 0.125 + m, -1))
    run_op(A._softmax.default, (rnd((5, 9, 4), torch.float32, g, layout="t"), 1, False))
    run_op(A._log_softmax.default, (rnd((5, 9, 4), torch.float32, g), -1, False))


def close_nan_inf(got, want, tol):
    """NaNs and infinities where want has them; the finite values within tol."""
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = ~torch.isnan(want)
    assert torch.equal(torch.isinf(got[ok]), torch.isinf(want[ok]))
    fin = ok & torch.isfinite(want)
    assert (got.double()[fin] - want[fin]).abs().max().item() <= tol


@pytest.mark.parametrize("isa", ["x86-64-v3", "x86-64-v4"])
def test_softmax_exp_drops_its_upper_check(isa):
    """An inline exp whose argument is x - max(x) (<= 0, or NaN) prints
    tcc_expf_le0 / tcc_expf_ftz_le0, without the clamp above 88.7
    (cpu/schedule.c: plan_exp_le0): softmax, log_softmax and a masked
    softmax, with rows holding +inf, NaN (payloads with low bits set:
    no select keeps them, the arithmetic does), all -inf and a 1e30 spread
    (results flushed or subnormal), against float64. An exp of x minus
    the max of a part of the row, of another tensor or of logsumexp's
    guarded max keeps the checks, and its overflow is inf."""
    if isa == "x86-64-v4" and HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    from torch.fx.experimental.proxy_tensor import make_fx
    g = gen(421)
    x = rnd((5, 6, 37), torch.float32, g, -30.0, 30.0)
    x[0, 1, 4] = float("inf")
    x[0, 2, 5] = float("nan")
    x.view(torch.int32)[4, 2, 9] = 0x7fc00001     # a NaN whose payload's low bits, added to
    x.view(torch.int32)[4, 3, 0] = -0x3fff        # an exponent, would make a number (0xffffc001)
    x[1, 3, :] = float("-inf")
    x[2, 4, 7] = 1e30
    x[2, 5, 8] = -1e30
    x[3, 0, :] = torch.linspace(-140.0, 0.0, 37)      # exps down into the subnormals
    body = lambda k: tk.kernel_text(k.source, "k0: ")  # noqa: E731

    # softmax: the exp's ulp, the sum's, 1 / sum and the product: up to 3
    # ulp of results near 1.0 (2.2e-7 seen on Zen 5 with libmvec's expf)
    cases = [(lambda x: torch.softmax(x, -1), lambda x: torch.softmax(x.double(), -1), "_le0(", 4e-7),
             (lambda x: torch.log_softmax(x, -1), lambda x: torch.log_softmax(x.double(), -1), "_le0(", 2e-5),
             (lambda x: torch.softmax(x, 1), lambda x: torch.softmax(x.double(), 1), "_le0(", 4e-7),
             # the exps themselves: a NaN lane is NaN by its own arithmetic
             (lambda x: torch.exp(x - x.amax(-1, keepdim=True)),
              lambda x: torch.exp(x.double() - x.double().amax(-1, keepdim=True)), "_le0(", 2e-7)]
    for fn, ref, mark, tol in cases:
        k = tk.compile_fx(make_fx(fn)(x), [x], isa=isa, keep_source=True)
        if isa == "x86-64-v4":
            assert mark in body(k), body(k)
        else:                     # libmvec's expf: no inline exp to change
            assert "_le0(" not in body(k)
        close_nan_inf(k(x)[0], ref(x), tol)
    # masked scores (-inf): tcc_expf_ftz_le0 on every target
    m = torch.rand(1, 6, 37, generator=g) > 0.25
    xm = x.nan_to_num(posinf=50.0, neginf=-50.0)
    xm.view(torch.int32)[4, 2, 9] = 0x7fc00001
    mfn = lambda s, m: torch.softmax(torch.where(m, s * 0.125, float("-inf")), -1)   # noqa: E731
    k = tk.compile_fx(make_fx(mfn)(xm, m), [xm, m], isa=isa, keep_source=True)
    assert "tcc_expf_ftz_le0(" in body(k), body(k)
    want = torch.softmax((xm.double() * 0.125).masked_fill(~m, float("-inf")), -1)
    close_nan_inf(k(xm, m)[0], torch.where(want < torch.finfo(torch.float32).tiny, 0.0, want), 4e-7)
    m[0, 2, 9] = True                                  # the payload NaN's lane
    mexp = lambda s, m: torch.exp(torch.where(m, s, float("-inf")) - torch.where(m, s, float("-inf")).amax(-1, keepdim=True))   # noqa: E731
    k = tk.compile_fx(make_fx(mexp)(xm, m), [xm, m], isa=isa, keep_source=True)
    assert "tcc_expf_ftz_le0(" in body(k), body(k)
    want = mexp(xm.double(), m)
    close_nan_inf(k(xm, m)[0], torch.where(want < torch.finfo(torch.float32).tiny, 0.0, want), 2e-7)
    # the max of part of the row, of another tensor, logsumexp: above 0 possible
    y = rnd((5, 6, 37), torch.float32, g, -30.0, 30.0)
    y[:, :, 30] = 95.0                 # exp(95 - max(first 8)) overflows to inf
    others = [lambda y: torch.exp(y - y[..., :8].amax(-1, keepdim=True)),
              lambda y: torch.exp(y - (y * 0.5).amax(-1, keepdim=True)),
              lambda y: torch.exp(torch.logsumexp(y * 0.5, -1))]
    for fn in others:
        k = tk.compile_fx(make_fx(fn)(y), [y], isa=isa, keep_source=True)
        assert "_le0(" not in k.source.split("end of preamble")[1], body(k)
        want = fn(y.double())
        got = k(y)[0]
        assert torch.equal(torch.isinf(got), torch.isinf(want) | (want > torch.finfo(torch.float32).max))
        fin = torch.isfinite(got)
        assert ((got.double()[fin] - want[fin]).abs() / want[fin].abs().clamp(min=1e-30)).max().item() < 1e-5


@pytest.mark.parametrize("isa", ["x86-64-v3", "x86-64-v4"])
def test_masked_scores_are_staged_in_the_output(isa):
    """Masked attention scores, softmax(where(mask, x * s, -inf)) with a
    bool mask: the select's values are stored in the output row once, by
    a loop of their own, and the max's and the sum's loops read them back
    as floats (cpu/schedule.c: plan_staged_row), so the kernel reads the
    mask once per element (twice before); log_softmax's element loop
    reads them too. A float mask (an additive one) has nothing narrow to
    stage and keeps its code. Rows fully masked (NaN, as eager), rows
    with a NaN score, a broadcast mask; against float64."""
    if isa == "x86-64-v4" and HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    from torch.fx.experimental.proxy_tensor import make_fx
    g = gen(431)
    x = rnd((3, 5, 40, 72), torch.float32, g, -20.0, 20.0)
    m = torch.rand(40, 72, generator=g) > 0.3
    m[7, :] = False                                   # a fully masked row
    x[1, 2, 9, 30] = float("nan")
    body = lambda k: tk.kernel_text(k.source, "k0: ")  # noqa: E731

    cases = [(lambda x, m: torch.softmax(torch.where(~m, float("-inf"), x * 0.125), -1), torch.softmax, 4e-7),
             (lambda x, m: torch.log_softmax(torch.where(m, x * 0.125, float("-inf")), -1), torch.log_softmax, 2e-5)]
    for fn, ref, tol in cases:
        k = tk.compile_fx(make_fx(fn)(x, m), [x, m], isa=isa, keep_source=True)
        text = body(k)
        assert text.count("= b1[") == 1, text                  # the mask, loaded once
        want = ref((x.double() * 0.125).masked_fill(~m, float("-inf")), -1)
        if ref is torch.softmax:
            want = torch.where(want < torch.finfo(torch.float32).tiny, 0.0, want)   # flushed (tcc_expf_ftz)
        close_nan_inf(k(x, m)[0], want, tol)
    fm = torch.where(m, 0.0, torch.finfo(torch.float32).min)
    fadd = lambda x, fm: torch.softmax(x * 0.125 + fm, -1)     # noqa: E731
    k = tk.compile_fx(make_fx(fadd)(x, fm), [x, fm], isa=isa, keep_source=True)
    assert body(k).count("= b1[") == 2, body(k)
    close_nan_inf(k(x, fm)[0], torch.softmax(x.double() * 0.125 + fm.double(), -1), 4e-7)


def test_out_of_range_index_is_an_error():
    x = torch.randn(3, 4)
    gm, ins = tk.op_graph(A.index_select.default, (x, 0, torch.tensor([0, 3])))
    k = tk.compile_fx(gm, ins)
    with pytest.raises(RuntimeError):
        k(*ins)
    gm, ins = tk.op_graph(A.index.Tensor, (x, [None, torch.tensor([1, -5])]))
    k = tk.compile_fx(gm, ins)
    with pytest.raises(RuntimeError):
        k(*ins)


def test_factories():
    for op, args, kw in [(A.full.default, ([2, 3], 1.5), {}), (A.full.default, ([4], 7), {}),
                         (A.full.default, ([2, 2], True), {}),
                         (A.zeros.default, ([3, 2],), {"dtype": torch.float64}),
                         (A.ones.default, ([5],), {"dtype": torch.int32}),
                         (A.arange.default, (10,), {}), (A.arange.start, (2, 9), {}),
                         (A.arange.start_step, (0, 1, 0.125), {}),
                         (A.arange.start_step, (10, -3, -3), {"dtype": torch.float32}),
                         (A.scalar_tensor.default, (3.25,), {})]:
        run_op(op, args, kw)
    x = rnd((3, 4), torch.bfloat16, gen(2))
    run_op(A.full_like.default, (x, 2.0))
    run_op(A.zeros_like.default, (x,))
    run_op(A.ones_like.default, (x,), {"dtype": torch.int64})


# ------------------------------------------------------- reductions

RED_TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-10, 1e-10), torch.float16: (5e-3, 5e-3),
           torch.bfloat16: (3e-2, 3e-2)}


@pytest.mark.parametrize("dims", [None, [0], [1], [-1, 0], [0, 2]])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_reductions(dims, keepdim, dtype):
    g = gen(hash((str(dims), keepdim, str(dtype))) & 0xffff)
    x = rnd((3, 5, 7), dtype, g, -2, 2, layout="t")
    tol = RED_TOL[dtype]
    d = dims if dims is not None else []
    run_op(A.sum.dim_IntList, (x, dims, keepdim), tol=tol)
    run_op(A.mean.dim, (x, dims, keepdim), tol=tol)
    run_op(A.amax.default, (x, d, keepdim), tol=tol)
    run_op(A.amin.default, (x, d, keepdim), tol=tol)
    run_op(A.var.correction, (x, dims), {"correction": 1, "keepdim": keepdim}, tol=tol)
    run_op(A.std.correction, (x, dims), {"correction": 0, "keepdim": keepdim}, tol=tol)
    run_op(A.var_mean.correction, (x, dims), {"keepdim": keepdim}, nout=2, tol=tol)
    if dims:
        run_op(A.logsumexp.default, (x, dims, keepdim), tol=tol)
    run_op(A.any.dims, ((x > 1), dims, keepdim))
    run_op(A.all.dims, ((x > -1.5), dims, keepdim))


@pytest.mark.parametrize("shape,dims", [((8, 16, 16, 16), [0, 2, 3]),   # batch norm's statistics
                                        ((16, 20000), [1]),               # long rows
                                        ((16, 8192), [1]),                # lanes folded once a row
                                        ((4, 65536), [1]),                # lanes folded each block
                                        ((4096, 32), [0])])               # columns
def test_float32_sums_as_accurate_as_eager(shape, dims):
    """float32 sums against the float64 sum: tccd's error is at most 3x
    eager's (eager sums in a cascade; tccd in vectorised float runs of at
    most 256 added in double). One float accumulator was 4-8x eager's,
    enough to move batch norm's outputs across a ReLU's kink in training."""
    g = gen(hash((shape, str(dims))) & 0xffff)
    x = rnd(shape, torch.float32, g, -1.5, 2.5)
    gm, ins = tk.op_graph(A.sum.dim_IntList, (x, dims))
    got = tk.compile_fx(gm, ins)(*ins)[0]
    ref = x.double().sum(dims)
    err = (got.double() - ref).abs().max().item()
    eager_err = (x.sum(dims).double() - ref).abs().max().item()
    assert err <= 3 * eager_err, f"sum over {dims} of {shape}: |error| {err:.3g}, eager's {eager_err:.3g}"


LANE_SUMS = re.compile(r"a\d+q\[i\d+l\] \+= ")


@pytest.mark.parametrize("isa", ["x86-64-v2", "x86-64-v3", "x86-64-v4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_sums_in_lane_accumulators(isa, dtype):
    """A float sum whose innermost loop is a whole number of chunks of
    four vectors and whose summand is cheap adds into one accumulator per
    lane of the chunk (cpu/emit.c, sum_lanes), folded after the row (or
    after each block of a float32 row longer than 256 elements a lane):
    row sums, layer norm's mean and variance over 768, the numpy FAQ's
    sum of an outer product over two dims (the chunks in the inner one),
    a long row, and a sum of float32 exps on x86-64-v4 (the prelude's
    inline exp: arithmetic in the lanes). Not taken: a row of 999 (no
    whole chunks), a sum of exps that call libm or libmvec (a call per
    vector). Fresh inputs against float64."""
    if isa == "x86-64-v4" and HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    g = gen(hash(("lanes", isa, str(dtype))) & 0xffff)
    tol = RED_TOL[dtype]
    w, b = rnd((768,), dtype, g), rnd((768,), dtype, g)

    def row_sum(x):
        return A.sum.dim_IntList(x, [1])

    def layer_norm(x, w, b):
        return A.native_layer_norm.default(x, [768], w, b, 1e-5)[0]

    def outer_sum(x, y):
        return A.sum.dim_IntList(A.mul.Tensor(A.unsqueeze.default(x, 2), A.unsqueeze.default(y, 1)), [1, 2])

    def exp_sum(x):
        return A.sum.dim_IntList(A.exp.default(x), [1])

    for fn, ins, lanes in [(row_sum, [rnd((37, 4096), dtype, g)], True),
                           (row_sum, [rnd((3, 65536), dtype, g)], True),
                           (layer_norm, [rnd((20, 768), dtype, g), w, b], True),
                           (outer_sum, [rnd((9, 96), dtype, g), rnd((9, 128), dtype, g)], True),
                           (row_sum, [rnd((5, 999), dtype, g)], False),
                           (exp_sum, [rnd((6, 1024), dtype, g, -2, 2)],
                            isa == "x86-64-v4" and dtype == torch.float32)]:
        gm = tk.aten_graph(fn, ins, decompose=False)
        k = tk.compile_fx(gm, ins, isa=isa, keep_source=True)
        assert (LANE_SUMS.search(k.source) is not None) == lanes, (fn.__name__, ins[0].shape, k.source[-2500:])
        want = fn(*[t.double() for t in ins])
        n = ins[0].shape[-1] * (ins[1].shape[-1] if fn is outer_sum else 1)
        torch.testing.assert_close(k(*ins)[0].double(), want, rtol=tol[0], atol=tol[1] * n ** 0.5)


COLUMN_SUMS = re.compile(r"for \(int64_t i\d+c = 0; ")


@pytest.mark.parametrize("rows,cols", [(300, 37), (1000, 130), (7, 2050)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_column_sums(rows, cols, dtype):
    """Sums over the rows of a [rows, cols] matrix read at a row stride run
    as column sums (cpu/schedule.c, plan_column_sums): blocks of columns,
    the row loop outside a SIMD loop over the block. Covered: a bias's
    gradient over a 3-D input (dims 0 and 1), a fused summand, layer
    norm's weight and bias gradients (two sums of one loop, per-row mean
    and rstd read once per row), column counts that leave a partial block,
    runs over 256 rows (float partials), a transposed input (its rows
    are unit-stride: no column sums), and a column mean with the std of
    the same columns (two graph nodes: one mean, lowered once, which the
    variance's stage reads; the torch.compile FAQ's numpy program).
    Against float64."""
    g = gen(hash(("colsum", rows, cols, str(dtype))) & 0xffff)
    tol = RED_TOL[dtype]
    x, y = rnd((rows, cols), dtype, g, -2, 2), rnd((rows, cols), dtype, g, -2, 2)
    mean, rstd = rnd((rows, 1), dtype, g, -1, 1), rnd((rows, 1), dtype, g, 0.5, 2)

    def bias_grad(x, y):
        return A.sum.dim_IntList(A.mul.Tensor(A.add.Tensor(x, y), 0.5), [0])

    def norm_grads(x, y, mean, rstd):
        xhat = A.mul.Tensor(A.sub.Tensor(x, mean), rstd)
        return A.sum.dim_IntList(A.mul.Tensor(y, xhat), [0]), A.sum.dim_IntList(y, [0])

    def bias_grad_3d(x):
        return A.sum.dim_IntList(x, [0, 1])

    def col_stats(x):
        return A.mean.dim(x, [0]), A.std.correction(x, [0], correction=0)

    x3 = rnd((2, rows, cols), dtype, g, -2, 2)
    for fn, ins, strided in [(bias_grad, [x, y], True), (norm_grads, [x, y, mean, rstd], True),
                             (bias_grad_3d, [x3], True), (bias_grad, [x.t().contiguous().t(), y], False),
                             (col_stats, [x], True)]:
        gm = tk.aten_graph(fn, ins, decompose=False)
        k = tk.compile_fx(gm, ins, keep_source=True)
        assert (COLUMN_SUMS.search(k.source) is not None) == strided, (fn.__name__, k.source[-2500:])
        want = fn(*[t.double() for t in ins])
        want = want if isinstance(want, tuple) else (want,)
        for got, w in zip(k(*ins), want):
            torch.testing.assert_close(got.double(), w, rtol=tol[0], atol=tol[1] * rows)


MERGED_LOOP = re.compile(r"for \(int64_t i\d+m = 0; ")


@pytest.mark.parametrize("shape,transposed", [((16, 24, 4, 4), False), ((3, 5, 7, 6), False),
                                              ((2, 3, 9, 70), False), ((3, 5, 7, 6), True)])
def test_short_reduction_loops_merge(shape, transposed):
    """A batch norm's statistics over small maps (DenseNet's 4x4 and 8x8):
    the two innermost reduction loops (H and W, one contiguous run) run as
    one loop long enough to vectorize (cpu/schedule.c, merged reduction
    loops); W of 70 is long enough alone, and a map stored transposed is
    not one run: neither merges. Mean and variance against float64."""
    g = gen(hash(("merge", shape, transposed)) & 0xffff)
    x = rnd(shape, torch.float32, g, -1, 3)
    if transposed:
        x = x.transpose(2, 3).contiguous().transpose(2, 3)

    def stats(x):
        return A.var_mean.correction(x, [0, 2, 3], correction=0, keepdim=True)
    gm = tk.aten_graph(stats, [x], decompose=False)
    k = tk.compile_fx(gm, [x], keep_source=True)
    assert (MERGED_LOOP.search(k.source) is not None) == (shape[-1] < 64 and not transposed), k.source[-2000:]
    for got, want in zip(k(x), stats(x.double())):
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.int32, torch.bool, torch.float16])
def test_reductions_whole_and_int(dtype):
    x = rnd((4, 6), dtype, gen(111), -2, 2, layout="slice")
    tol = RED_TOL.get(dtype)
    run_op(A.sum.default, (x,), tol=tol)
    run_op(A.sum.dim_IntList, (x, [1]), {"dtype": torch.float64}, tol=(1e-6, 1e-6))
    if dtype != torch.bool:
        run_op(A.prod.default, (x,), tol=tol)
        run_op(A.prod.dim_int, (x, 0), tol=tol)
    run_op(A.max.default, (x,))
    run_op(A.min.default, (x,))
    if dtype != torch.bool:
        run_op(A.argmax.default, (x,))
        run_op(A.argmin.default, (x, 1, True))
    run_op(A.any.default, (x,))
    run_op(A.all.dim, (x, 0))
    run_op(A.any.dim, (x, 1, True))
    if dtype != torch.bool:
        run_op(A.max.dim, (x, 1), nout=2)
        run_op(A.min.dim, (x, 0, True), nout=2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64,
                                   torch.bool])
@pytest.mark.parametrize("layout", ["contig", "t", "slice", "expand"])
def test_cumsum(dtype, layout):
    """cumsum along each dim (negative dims too), with and without dtype=,
    on fresh random inputs in every layout; integers and bool sum exactly
    (as int64), floats within their tolerance of eager (the sum's order
    differs), and against float64 for float32."""
    g = gen(hash((str(dtype), layout, "cumsum")) & 0xffff)
    x = rnd((5, 37, 3), dtype, g, layout=layout)
    tol = {torch.float32: (1e-5, 5e-5), torch.bfloat16: (2e-2, 5e-2)}.get(dtype)
    for dim in (0, 1, -1):
        run_op(A.cumsum.default, (x, dim), tol=tol)
    run_op(A.cumsum.default, (x, 1), {"dtype": torch.float64}, tol=TOL[torch.float64] if dtype != torch.float64 else None)
    if dtype == torch.float32:
        gm, ins = tk.op_graph(A.cumsum.default, (x, 1))
        got = tk.compile_fx(gm, ins)(*ins)[0]
        check(got.double(), torch.cumsum(x.double(), 1), tol=(1e-5, 5e-5))
    run_op(A.cumsum.default, (rnd((), dtype, g), 0))  # a 0-dim input is itself


def test_reductions_nan_and_ties():
    x = torch.tensor([[1.0, 3.0, 3.0, 2.0], [float("nan"), 1.0, 5.0, float("nan")],
                      [-float("inf"), -float("inf"), -float("inf"), -float("inf")]])
    run_op(A.amax.default, (x, [1]))
    run_op(A.argmax.default, (x, 1))
    run_op(A.argmin.default, (x, 1))
    run_op(A.max.dim, (x, 1), nout=2)
    run_op(A.logsumexp.default, (x[2:], [1]))
    run_op(A._softmax.default, (x[:1], 1, False))


def test_reduction_empty_dims():
    x = torch.randn(0, 5)
    run_op(A.sum.dim_IntList, (x, [0]))
    run_op(A.mean.dim, (torch.randn(3, 0), [0]))


# ------------------------------------------------------- composites

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("dim", [-1, 0, 1])
def test_softmax(dtype, dim):
    g = gen(hash((str(dtype), dim)) & 0xffff)
    x = rnd((6, 9, 5), dtype, g, -6, 6, layout="slice")
    tol = RED_TOL[dtype]
    run_op(A._softmax.default, (x, dim, False), tol=tol)
    run_op(A._log_softmax.default, (x, dim, False), tol=tol)
    run_op(A.softmax.int, (x, dim), tol=tol)
    run_op(A.log_softmax.int, (x, dim, torch.float64), tol=(1e-6, 1e-6) if dtype != torch.float64 else None)
    y = torch.softmax(x.float(), dim).to(dtype)
    go = rnd((6, 9, 5), dtype, g)
    run_op(A._softmax_backward_data.default, (go, y, dim, dtype), tol=tol)
    ly = torch.log_softmax(x.float(), dim).to(dtype)
    run_op(A._log_softmax_backward_data.default, (go, ly, dim, dtype), tol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("affine", [True, False])
def test_layer_norm(dtype, affine):
    g = gen(hash((str(dtype), affine)) & 0xffff)
    x = rnd((4, 3, 16), dtype, g, -2, 2, layout="t")
    w = rnd((16,), dtype, g) if affine else None
    b = rnd((16,), dtype, g) if affine else None
    tol = RED_TOL[dtype]
    run_op(A.native_layer_norm.default, (x, [16], w, b, 1e-5), nout=3, tol=tol)
    run_op(A.layer_norm.default, (x, [3, 16], None, None, 1e-6), tol=tol)
    run_op(A.rms_norm.default, (x, [16], w, 1e-6), tol=tol)
    run_op(A.rms_norm.default, (x, [16]), tol=tol)
    # backward
    out, mean, rstd = A.native_layer_norm.default(x, [16], w, b, 1e-5)
    go = rnd((4, 3, 16), dtype, g)
    mask = [True, affine, affine]
    run_op(A.native_layer_norm_backward.default, (go, x, [16], mean, rstd, w, b, mask), nout=3,
           take=[0, 1, 2] if affine else [0], tol=(RED_TOL[dtype][0] * 10, RED_TOL[dtype][1] * 10))


def test_batch_norm_inference():
    g = gen(121)
    x = rnd((2, 3, 4, 5), torch.float32, g)
    w, b = rnd((3,), torch.float32, g), rnd((3,), torch.float32, g)
    rm, rv = rnd((3,), torch.float32, g), rnd((3,), torch.float32, g, 0.5, 2)
    run_op(A._native_batch_norm_legit_no_training.default, (x, w, b, rm, rv, 0.1, 1e-5), nout=3)
    run_op(A._native_batch_norm_legit_no_training.default, (x, None, None, rm, rv, 0.1, 1e-3), nout=3)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_batch_norm_functional(training, dtype):
    g = gen(122)
    x = rnd((4, 3, 5, 2), dtype, g)
    w, b = rnd((3,), dtype, g), rnd((3,), dtype, g)
    sd = torch.float32 if dtype == torch.bfloat16 else dtype   # eager refuses other mixes
    rm, rv = rnd((3,), sd, g), rnd((3,), sd, g, 0.5, 2)
    tol = RED_TOL[dtype]
    run_op(A._native_batch_norm_legit_functional.default, (x, w, b, rm, rv, training, 0.1, 1e-5),
           nout=5, tol=tol)
    run_op(A._native_batch_norm_legit_functional.default, (x, None, None, rm, rv, training, 0.3, 1e-3),
           nout=5, take=[0, 3, 4], tol=tol)


@pytest.mark.parametrize("scale", [False, True])
def test_embedding_backward(scale):
    g = gen(131)
    ids = torch.randint(0, 9, (3, 5), generator=g)
    go = rnd((3, 5, 4), torch.float32, g)
    run_op(A.embedding_dense_backward.default, (go, ids, 9, 2, scale))
    run_op(A.embedding_dense_backward.default, (go, ids, 9, -1, scale))
    # 1-D int32 ids, float64 (the GEMM form without scale_grad_by_freq)
    ids1 = torch.randint(0, 7, (11,), generator=g).to(torch.int32)
    go1 = rnd((11, 6), torch.float64, g)
    run_op(A.embedding_dense_backward.default, (go1, ids1, 7, 3, scale))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_embedding_backward_of_a_large_vocabulary_is_a_scatter_add(dtype):
    """A real vocabulary (the dense forms cost rows x tokens x dims) is
    the CPU's scatter-add step: one extern kernel, tokens x dims work,
    eager's sums (each row in token order) for repeated ids, a padding
    row, and a gradient read through a transposed layout."""
    g = gen(hash(str(dtype)) & 0xffff)
    V, D = 30522, 96
    ids = torch.randint(0, 40, (4, 64), generator=g)       # many repeats
    ids[0, :8] = 3                                          # padding_idx's tokens
    ids[1, 0] = V - 1                                       # the last row
    go = rnd((64, 4, D), dtype, g).transpose(0, 1)         # [4, 64, D], strided
    for pad in (3, -1):
        args = (go, ids, V, pad, False)
        gm, ins = tk.op_graph(A.embedding_dense_backward.default, args)
        k = tk.compile_fx(gm, ins, keep_source=True)
        assert "extern row index-add" in k.source
        got = k(*ins)[0]
        if dtype == torch.bfloat16:
            # eager adds in bfloat16, rounding every partial sum; tccd sums
            # in float32 and rounds once: against float64, within 2 ulps
            want = A.embedding_dense_backward.default(go.double(), ids, V, pad, False).to(dtype)
            torch.testing.assert_close(got.double(), want.double(), rtol=1.6e-2, atol=1e-5)
        else:
            check(got, A.embedding_dense_backward.default(*args), tol=RED_TOL[dtype])
        if pad >= 0:
            assert torch.count_nonzero(got[pad]) == 0


def test_embedding_backward_feeding_another_op():
    """The step's rows read by a later op (through a TEMP, not written in
    place into an output) and returned beside it."""
    g = gen(11)
    ids = torch.randint(0, 500, (2, 33), generator=g)
    go = rnd((2, 33, 40), torch.float32, g)
    def f(go, ids):
        gw = A.embedding_dense_backward.default(go, ids, 500, -1, False)
        return A.mul.Tensor(gw, 0.5), A.sum.dim_IntList(gw, [1])
    gm = tk.aten_graph(f, [go, ids], decompose=False)
    k = tk.compile_fx(gm, [go, ids], keep_source=True)
    assert "extern row index-add" in k.source
    for got, want in zip(k(go, ids), f(go, ids)):
        check(got, want, tol=RED_TOL[torch.float32])


def test_embedding_backward_index_out_of_range_is_reported():
    """An id outside the table makes the entry return 1 (PyTorch raises
    there), whatever thread meets it; the padding row is not an error."""
    g = gen(12)
    go = rnd((2, 16, 80), torch.float32, g)
    ids = torch.randint(0, 300, (2, 16), generator=g)
    gm, ins = tk.op_graph(A.embedding_dense_backward.default, (go, ids, 300, 5, False))
    k = tk.compile_fx(gm, ins)
    k(*ins)
    for bad in (300, -1):
        ids2 = ids.clone()
        ids2[1, 7] = bad
        with pytest.raises(RuntimeError, match="index out of range"):
            k(go, ids2)
    # padding_idx -1 is "none": an id of -1 is out of range too
    gm, ins = tk.op_graph(A.embedding_dense_backward.default, (go, ids, 300, -1, False))
    k = tk.compile_fx(gm, ins)
    ids2 = ids.clone()
    ids2[0, 0] = -1
    with pytest.raises(RuntimeError, match="index out of range"):
        k(go, ids2)


def test_embedding_backward_bert_size_matches_eager():
    """BERT-base's word embeddings: 30522 x 768, 8 x 128 tokens."""
    g = gen(7)
    ids = torch.randint(0, 30522, (8, 128), generator=g)
    go = rnd((8, 128, 768), torch.float32, g)
    run_op(A.embedding_dense_backward.default, (go, ids, 30522, 0, False), tol=RED_TOL[torch.float32])


# ------------------------------------------------------------ matmul

MM_TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-10, 1e-10), torch.bfloat16: (3e-2, 3e-2),
          torch.float16: (5e-3, 5e-3)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("la,lb", [("contig", "contig"), ("t", "contig"), ("contig", "t"),
                                   ("slice", "t"), ("expand", "contig")])
def test_mm_family(dtype, la, lb):
    g = gen(hash((str(dtype), la, lb)) & 0xffff)
    a = rnd((6, 5), dtype, g, layout=la)
    b = rnd((5, 7), dtype, g, layout=lb)
    bias = rnd((7,), dtype, g)
    tol = MM_TOL[dtype]
    run_op(A.mm.default, (a, b), tol=tol)
    run_op(A.addmm.default, (bias, a, b), tol=tol)
    run_op(A.addmm.default, (bias.reshape(1, 7), a, b), {"beta": 0.5, "alpha": 2}, tol=tol)
    x3 = rnd((3, 6, 5), dtype, g, layout=la)
    y3 = rnd((3, 5, 4), dtype, g, layout=lb)
    run_op(A.bmm.default, (x3, y3), tol=tol)
    w = rnd((7, 5), dtype, g, layout=lb)
    run_op(A.linear.default, (x3, w, bias), tol=tol)
    run_op(A.linear.default, (a, w), tol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("la,lb", [("contig", "contig"), ("t", "contig"), ("contig", "t"),
                                   ("t", "t"), ("slice", "slice")])
def test_gemm_on_threads(dtype, la, lb):
    """GEMMs big enough to run on the OpenMP threads (a slab of rows or
    of columns per thread, or the batch in parallel): every layout, both
    cuts, against float64; the kernel source shows the parallel region."""
    g = gen(hash((str(dtype), la, lb, "threads")) & 0xffff)
    tol = MM_TOL[dtype]
    for (m, k, n) in [(97, 64, 70), (6, 144, 515)]:   # slabs of rows / of columns
        a = rnd((m, k), dtype, g, layout=la)
        b = rnd((k, n), dtype, g, layout=lb)
        kern = run_op(A.mm.default, (a, b), tol=tol)
        check(kern(a, b)[0], torch.mm(a.double(), b.double()).to(dtype), tol=tol)
    x3 = rnd((3, 40, 64), dtype, g, layout=la)
    y3 = rnd((3, 64, 50), dtype, g, layout=lb)
    run_op(A.bmm.default, (x3, y3), tol=tol)
    def gemm_kernel(src):
        return tk.kernel_text(src, r"k\d+: extern gemm ")
    gm, ins = tk.op_graph(A.mm.default, (a, b))
    k = tk.compile_request(tk.request_for(gm, ins), keep_source=True)
    body = gemm_kernel(k.source)
    if "dnnl_sgemm(" in body:  # float32 on the oneDNN road: oneDNN splits it over the threads
        assert dtype == torch.float32 and "onednn/" in k.identity, body
    elif "float *parts[64];" in body:  # 6 rows times a weight stored [K, N]: K split among the threads
        assert dtype == torch.float32 and b.stride(1) == 1 and "#pragma omp parallel\n" in body, body
    elif "vector_size(" in body:  # 6 rows times a weight stored [N, K]: its rows streamed, groups of blocks on the threads (or chunks shared with the helper thread)
        assert dtype == torch.float32 and lb == "t" and "#pragma omp parallel for schedule(static) if(1 && !tl)" in body, body
    else:
        assert "#pragma omp parallel" in body and "omp_get_thread_num" in body, body
    gm, ins = tk.op_graph(A.bmm.default, (x3, y3))
    body = gemm_kernel(tk.compile_request(tk.request_for(gm, ins), keep_source=True).source)
    assert "#pragma omp parallel for" in body, body  # the batch in parallel, either road
    small = tk.op_graph(A.mm.default, (rnd((8, 8), dtype, g), rnd((8, 8), dtype, g)))
    k = tk.compile_request(tk.request_for(*small), keep_source=True)
    assert "#pragma omp" not in gemm_kernel(k.source), k.source


# The two roads of a float32 GEMM: oneDNN's dnnl_sgemm (the default when
# tccd is built with oneDNN) and, with TCC_NO_ONEDNN=1, OpenBLAS's
# cblas_sgemm. Each must match float64 on the shapes of real models (one
# row: a decode step; nine: a short sentence), every operand layout, and
# each must be the road taken.
@pytest.mark.parametrize("road", ["onednn", "openblas"])
@pytest.mark.parametrize("la,lb", [("contig", "contig"), ("t", "contig"), ("contig", "t"), ("slice", "t"),
                                   ("expand", "contig")])
def test_gemm_roads(road, la, lb):
    g = gen(hash((road, la, lb, "gemm-road")) & 0xffff)
    env = dict(os.environ, TCC_NO_ONEDNN="1" if road == "openblas" else "0")
    tol = (2e-4, 1e-3)  # float32 sums of up to 768 products of values in [-3, 3]
    cases = [(A.mm.default, (rnd((1, 768), torch.float32, g, layout=la), rnd((768, 300), torch.float32, g, layout=lb))),
             (A.mm.default, (rnd((13, 96), torch.float32, g, layout=la), rnd((96, 130), torch.float32, g, layout=lb))),
             (A.linear.default, (rnd((2, 9, 64), torch.float32, g, layout=la), rnd((200, 64), torch.float32, g, layout=lb),
                                 rnd((200,), torch.float32, g))),
             (A.bmm.default, (rnd((12, 9, 64), torch.float32, g, layout=la), rnd((12, 64, 9), torch.float32, g, layout=lb))),
             (A.bmm.default, (rnd((4, 40, 64), torch.float32, g, layout=la), rnd((4, 64, 50), torch.float32, g, layout=lb)))]
    for op, args in cases:
        gm, ins = tk.op_graph(op, args)
        k = tk.compile_fx(gm, ins, env=env, keep_source=True)
        if road == "onednn" and "onednn/" not in k.identity:
            pytest.skip("tccd is built without oneDNN (meson -Donednn)")
        # up to 8 rows against a weight stored [K, N] split K on either road
        # (test_few_rows_times_kn_weight_split_k), up to 12 against one
        # stored [N, K] stream its rows (test_few_rows_times_linear_weight_stream_its_rows)
        split = op is A.mm.default and args[0].shape[0] <= 8 and args[1].stride(1) == 1
        stream = op is A.mm.default and args[0].shape[0] <= 12 and lb == "t"
        assert ("dnnl_sgemm(" in k.source) == (road == "onednn" and not split and not stream), k.source
        assert ("cblas_sgemm(" in k.source) == (road == "openblas" and not split and not stream), k.source
        assert ("float *parts[" in k.source) == split, k.source
        want = op(*[a.double() if isinstance(a, torch.Tensor) else a for a in args]).float()
        check(k(*ins)[0], want, tol=tol)
        check(k(*ins)[0], want, tol=tol)  # a second call (oneDNN's kernels are made on the first)


def test_matmul_shapes():
    g = gen(141)
    for sa, sb in [((5,), (5,)), ((3, 5), (5,)), ((5,), (5, 4)), ((2, 3, 5), (5, 4)),
                   ((2, 1, 3, 5), (4, 5, 6)), ((3, 5), (2, 5, 4))]:
        a = rnd(sa, torch.float32, g)
        b = rnd(sb, torch.float32, g)
        run_op(A.matmul.default, (a, b), tol=(1e-4, 1e-4))


def test_empty_matmul():
    run_op(A.mm.default, (torch.randn(3, 0), torch.randn(0, 4)))
    run_op(A.mm.default, (torch.randn(0, 3), torch.randn(3, 4)))


@pytest.mark.parametrize("rows", [13, 32, 33])
def test_few_rows_times_linear_weight_is_the_transposed_product(rows):
    """float32 on the oneDNN road: few rows (up to 32, past those that
    stream the weight: 12 on x86-64-v3) times a weight stored [N, K]
    (nn.Linear's) is computed as C^T = W . x^T, which dnnl_sgemm runs
    1.6-2.5x faster (lower_matmul.c, transposed_product), and the epilogue
    (bias, gelu) reads C through it; 33 rows stay C = x . W^T. Fresh
    inputs, against float64."""
    g = gen(hash(("few rows", rows)) & 0xffff)
    x, w, b = rnd((rows, 96), torch.float32, g, -1, 1), rnd((400, 96), torch.float32, g, -1, 1), rnd((400,), torch.float32, g)

    def f(x, w, b):
        return A.gelu.default(A.addmm.default(b, x, A.t.default(w)))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    k = tk.compile_fx(gm, [x, w, b], keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN (meson -Donednn)")
    swapped = rows <= 32
    head = "[400 x %d x 96] x 1" % rows if swapped else "[%d x 400 x 96] x 1" % rows
    assert "extern gemm " + head in k.source, re.findall(r"extern gemm \[[^\]]*\] x \d+", k.source)
    want = f(x.double(), w.double(), b.double())
    torch.testing.assert_close(k(x, w, b)[0].double(), want, rtol=1e-4, atol=1e-4)


HOST_ISA = __import__("tccd.config", fromlist=["x"]).host_cpu_isa()


@pytest.mark.parametrize("isa,rows,n,k,ld", [("x86-64-v3", 1, 401, 100, 100), ("x86-64-v4", 1, 2000, 768, 800),
                                             ("x86-64-v3", 2, 400, 96, 96), ("x86-64-v3", 6, 401, 100, 100),
                                             ("x86-64-v3", 4, 300, 64, 71), ("x86-64-v3", 9, 768, 768, 768),
                                             ("x86-64-v3", 12, 401, 100, 100), ("x86-64-v4", 9, 768, 768, 768),
                                             ("x86-64-v4", 12, 401, 100, 100), ("x86-64-v4", 5, 3, 17, 17),
                                             ("x86-64-v3", 9, 77, 3000, 3000), ("x86-64-v4", 9, 770, 3000, 3010),
                                             ("x86-64-v4", 3, 50, 3100, 3100)])
def test_few_rows_times_linear_weight_stream_its_rows(isa, rows, n, k, ld):
    """Few rows (1..12, on AVX2 and AVX-512) times a weight stored
    [N, K] run a generated kernel that reads each weight row once
    (cpu/schedule.c, plan_stream_rows; dnnl_sgemm read such weights at
    half the memory's speed): no library call, C = x . W^T, and the
    epilogue reads it. Shapes with a k tail past the last vector and N
    not a multiple of the block's rows; a weight whose rows are further
    apart than k (ld: a slice of a wider one); x a transposed view
    (packed); x's rows over 32 KB, whose k runs in chunks (the last one
    short, with the tail). Fresh inputs, against float64."""
    if isa == "x86-64-v4" and HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    g = gen(hash(("stream rows", isa, rows, n, k, ld)) & 0xffff)
    x = rnd((k, rows), torch.float32, g, -1, 1).t()
    w, b = rnd((n, ld), torch.float32, g, -1, 1)[:, :k], rnd((n,), torch.float32, g)

    def f(x, w, b):
        return A.gelu.default(A.addmm.default(b, x, A.t.default(w)))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    kern = tk.compile_fx(gm, [x, w, b], isa=isa, keep_source=True)
    assert "extern gemm [%d x %d x %d] x 1" % (rows, n, k) in kern.source, \
        re.findall(r"extern gemm \[[^\]]*\] x \d+", kern.source)
    assert "dnnl_sgemm(" not in kern.source and "cblas_sgemm(" not in kern.source
    assert "vector_size(%d)" % (64 if isa == "x86-64-v4" else 32) in kern.source
    assert ("for (int64_t k0 = 0;" in kern.source) == (rows * k * 4 > 32768)  # k in chunks
    # the weight's rows prefetched into L2 (prefetcht2: locality 1; not
    # non-temporal, which an Intel Xeon puts in L1 alone)
    assert re.search(r"__builtin_prefetch\(pf \+ [^;]*, 0, 1\);", kern.source), kern.source
    assert_gemm_fuses_madds(kern)
    want = f(x.double(), w.double(), b.double())
    for _ in range(2):
        torch.testing.assert_close(kern(x, w, b)[0].double(), want, rtol=1e-4, atol=1e-4)


def assert_gemm_fuses_madds(kern):
    """The few-row GEMM kernel, and it alone, is built with its
    multiply-adds contracted into FMAs (cpu/emit.c: the build's
    -ffp-contract=off holds everywhere else): the pragmas wrap its body,
    and the body's object code (its OpenMP part too) holds packed FMAs."""
    source = kern.source
    push = '#pragma GCC optimize("fp-contract=fast")'
    assert source.count(push) == 1, source
    gemm = source.index("extern gemm [")          # the kernel's comment
    start = source.index(push)
    end = source.index("#pragma GCC pop_options", start)
    body = source[start:end]
    kernel_comment = re.compile(r"/\* k\d+: ")
    assert gemm < start and not kernel_comment.search(source, gemm, start), source
    assert "TCC_BODY int tcc_b" in body and not kernel_comment.search(body), source
    name = re.search(r"TCC_BODY int (tcc_b[0-9a-f]+)\(", body).group(1)
    dis = subprocess.run(["objdump", "-d", "--no-show-raw-insn", kern.lib._name],
                         capture_output=True, text=True, check=True).stdout
    code = [f for f in re.split(r"\n(?=[0-9a-f]+ <)", dis) if re.match(r"[0-9a-f]+ <%s[.>]" % name, f)]
    assert code and any(re.search(r"vfmadd\w*ps\s[^\n]*%[yz]mm", f) for f in code), re.findall(r"<[^>]+>:", dis)


@pytest.mark.parametrize("isa,rows,k,n,ld,xstride", [("x86-64-v3", 1, 768, 2304, 2304, 1),
                                                      ("x86-64-v3", 1, 3072, 770, 770, 1),
                                                      ("x86-64-v3", 2, 37, 300, 311, 3),
                                                      ("x86-64-v3", 5, 9, 8, 8, 1),
                                                      ("x86-64-v3", 8, 768, 3072, 3072, 1),
                                                      ("x86-64-v4", 1, 768, 2304, 2304, 1),
                                                      ("x86-64-v4", 3, 101, 35, 40, 2),
                                                      ("x86-64-v4", 8, 3072, 768, 768, 1)])
def test_few_rows_times_kn_weight_split_k(isa, rows, k, n, ld, xstride):
    """One to eight rows times a weight stored [K, N] (GPT-2's Conv1D in
    a decode step, one sequence or a batch: addmm(b, x, W)) run a
    generated kernel in which each thread reads one contiguous run of the
    weight's rows into partial rows and the partial rows are added
    (cpu/schedule.c, plan_split_k; oneDNN split such weights by columns
    and read them slower): no library call, and the epilogue reads the
    result. k not a multiple of the eight rows a pass or of the threads,
    n past the last vector, a weight whose rows are further apart than n
    (ld: a slice of a wider one), x strided along k; parallel and serial
    sizes. Fresh inputs, against float64."""
    if isa == "x86-64-v4" and HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    g = gen(hash(("split k", isa, rows, k, n, ld, xstride)) & 0xffff)
    x = rnd((rows, k * xstride), torch.float32, g, -1, 1)[:, ::xstride]
    w, b = rnd((k, ld), torch.float32, g, -1, 1)[:, :n], rnd((n,), torch.float32, g)

    def f(x, w, b):
        return A.gelu.default(A.addmm.default(b, x, w))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    kern = tk.compile_fx(gm, [x, w, b], isa=isa, keep_source=True)
    assert "extern gemm [%d x %d x %d] x 1" % (rows, n, k) in kern.source, \
        re.findall(r"extern gemm \[[^\]]*\] x \d+", kern.source)
    assert "dnnl_sgemm(" not in kern.source and "cblas_sgemm(" not in kern.source
    assert "float *parts[" in kern.source and "vector_size(%d)" % (64 if isa == "x86-64-v4" else 32) in kern.source
    body = tk.kernel_text(kern.source, r"k\d+: extern gemm ")
    assert ("#pragma omp parallel\n" in body) == (2 * rows * k * n >= 1 << 19), body
    assert ("#pragma omp" in body) == (2 * rows * k * n >= 1 << 19), body  # serial: no region
    assert re.search(r"__builtin_prefetch\(w \+ [^;]*, 0, 1\);", body), body   # into L2
    assert_gemm_fuses_madds(kern)
    want = f(x.double(), w.double(), b.double())
    for _ in range(50):  # every call: a thread that left early freed its partial rows once
        torch.testing.assert_close(kern(x, w, b)[0].double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,n,k,ld", [(32, 3072, 768, 768), (13, 400, 96, 96), (20, 130, 70, 75),
                                          (64, 700, 40, 70), (17, 300, 33, 33)])
def test_few_rows_times_linear_weight_narrow(rows, n, k, ld):
    """On AVX-512 13-64 rows times nn.Linear's weight run a generated
    kernel that streams the weight's rows, each element once, against x
    packed into vectors and writes C = x . W^T from the tiles transposed
    (cpu/schedule.c, plan_narrow; oneDNN's road computes C^T = W . x^T,
    test_few_rows_times_linear_weight_is_the_transposed_product); so
    does any GEMM of at least 64 rows against 13-64 columns (700 rows of
    x times a [40, 64] W), whose tiles are C's rows. Rows or columns not
    a multiple of the block's, a narrow side past the last whole vector,
    a weight slice whose rows are further apart than k (ld), parallel
    and serial sizes. Fresh inputs, against float64."""
    if HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    g = gen(hash(("narrow", rows, n, k, ld)) & 0xffff)
    if rows <= 32:
        x, w = rnd((rows, k), torch.float32, g, -1, 1), rnd((n, ld), torch.float32, g, -1, 1)[:, :k]
        b = rnd((n,), torch.float32, g)

        def f(x, w, b):
            return A.gelu.default(A.addmm.default(b, x, A.t.default(w)))
        head = "extern gemm [%d x %d x %d] x 1" % (rows, n, k)   # C itself, not C^T
    else:   # x [n, k] . W [k, rows]: rows columns, W a slice of a [k, ld] weight
        x, w = rnd((n, k), torch.float32, g, -1, 1), rnd((k, ld), torch.float32, g, -1, 1)[:, :rows]
        b = rnd((rows,), torch.float32, g)

        def f(x, w, b):
            return A.gelu.default(A.addmm.default(b, x, w))
        head = "extern gemm [%d x %d x %d] x 1" % (n, rows, k)
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    kern = tk.compile_fx(gm, [x, w, b], isa="x86-64-v4", keep_source=True)
    assert head in kern.source, re.findall(r"extern gemm \[[^\]]*\] x \d+", kern.source)
    body = tk.kernel_text(kern.source, r"k\d+: extern gemm ")
    assert "dnnl_sgemm(" not in body and "cblas_sgemm(" not in body, body
    assert "float *restrict bt = aligned_alloc(64," in body and "vector_size(64)" in body, body
    par = 2 * rows * n * k >= 1 << 19   # TCC_GEMM_PARALLEL_FLOPS
    assert ("#pragma omp parallel if(1)" in body) == par, body
    assert re.search(r"__builtin_prefetch\(pf\[i\] \+ k, 0, 1\);", body), body   # next block's rows into L2
    assert_gemm_fuses_madds(kern)
    want = f(x.double(), w.double(), b.double())
    for _ in range(3):
        torch.testing.assert_close(kern(x, w, b)[0].double(), want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows,k,n,ld,xstride", [(9, 768, 3072, 3072, 1), (32, 768, 2304, 2304, 1),
                                                 (32, 3072, 768, 768, 1), (13, 100, 50, 60, 2),
                                                 (20, 37, 97, 97, 1), (17, 9000, 48, 48, 1)])
def test_rows_times_kn_weight_split_k_tiled(rows, k, n, ld, xstride):
    """On AVX-512 9 to 32 rows times a weight stored [K, N] (GPT-2's
    Conv1D over a prompt) split K too, each thread's run in passes
    through 8 x 48 register tiles into partial rows from the heap
    (cpu/schedule.c, plan_split_k_tiled; oneDNN and MKL packed such
    weights): no library call. Rows not a multiple of 8, k not a
    multiple of the pass or the threads, columns past the last 48 (and
    none: 48), a weight slice (ld), x strided along k, a serial size.
    Fresh inputs, against float64."""
    if HOST_ISA != "x86-64-v4":
        pytest.skip("the host has no AVX-512 (x86-64-v4)")
    g = gen(hash(("split k tiled", rows, k, n, ld, xstride)) & 0xffff)
    x = rnd((rows, k * xstride), torch.float32, g, -1, 1)[:, ::xstride]
    w, b = rnd((k, ld), torch.float32, g, -1, 1)[:, :n], rnd((n,), torch.float32, g)

    def f(x, w, b):
        return A.gelu.default(A.addmm.default(b, x, w))
    gm = tk.aten_graph(f, [x, w, b], decompose=False)
    kern = tk.compile_fx(gm, [x, w, b], isa="x86-64-v4", keep_source=True)
    assert "extern gemm [%d x %d x %d] x 1" % (rows, n, k) in kern.source, \
        re.findall(r"extern gemm \[[^\]]*\] x \d+", kern.source)
    body = tk.kernel_text(kern.source, r"k\d+: extern gemm ")
    assert "dnnl_sgemm(" not in body and "cblas_sgemm(" not in body, body
    assert "float *parts[64];" in body and "vec acc[8][3];" in body, body
    par = 2 * rows * k * n >= 1 << 19   # TCC_GEMM_PARALLEL_FLOPS
    assert ("#pragma omp parallel if(1)" in body) == par, body
    assert ("nlo = 0, nhi = %d;" % n) in body and "for (; n0 < nhi; n0++)" in body and re.search(r"__builtin_prefetch\(pb \+ [^;]*, 0, 1\);", body), body
    assert_gemm_fuses_madds(kern)
    want = f(x.double(), w.double(), b.double())
    for _ in range(20):  # every call: a thread that left early freed its partial rows once
        torch.testing.assert_close(kern(x, w, b)[0].double(), want, rtol=1e-4, atol=2e-4)


def test_nine_rows_times_kn_weight_stay_onednn():
    """Nine rows times a weight stored [K, N] are past the rows that
    split K (cpu/schedule.c, SPLIT_K_MAX_ROWS) with vectors of x: on
    AVX2 dnnl_sgemm's on the oneDNN road (AVX-512 tiles them,
    test_rows_times_kn_weight_split_k_tiled). Fresh inputs, against
    float64."""
    g = gen(hash("nine rows kn") & 0xffff)
    x, w = rnd((9, 64), torch.float32, g, -1, 1), rnd((64, 40), torch.float32, g, -1, 1)
    gm, ins = tk.op_graph(A.mm.default, (x, w))
    k = tk.compile_fx(gm, ins, keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN (meson -Donednn)")
    assert "dnnl_sgemm(" in k.source and "float *parts[" not in k.source, k.source
    check(k(*ins)[0], torch.mm(x.double(), w.double()).float(), tol=(1e-4, 1e-4))


# ------------------------------------------------------ convolution
#
# float32: oneDNN steps (when built with oneDNN) + a fused epilogue;
# float64 (and float32 with TCC_NO_ONEDNN=1): im2col + GEMM (extern) + the
# epilogue; 1x1 stride-1 unpadded ungrouped ones: a GEMM batched over the
# images (both dtypes); backward: GEMMs + a col2im gather. Reference: eager
# aten.convolution(_backward) on the same inputs.
# float32 tolerance (1e-4, 1e-4): sums of up to a few hundred products in
# a different order (OpenBLAS vs oneDNN); float64 1e-10.

CONV_TOL = {torch.float32: (1e-4, 1e-4), torch.float64: (1e-10, 1e-10)}

# (N, Cin, spatial, Cout, kernel, stride, padding, dilation, groups, bias)
CONV_CASES = [
    (2, 4, (9, 9), 6, (3, 3), (1, 1), (1, 1), (1, 1), 1, True),      # 3x3 same padding
    (1, 3, (8, 8), 5, (3, 3), (1, 1), (1, 1), (1, 1), 1, False),     # batch 1
    (3, 4, (7, 9), 6, (1, 1), (1, 1), (0, 0), (1, 1), 1, True),      # 1x1
    (1, 4, (6, 6), 8, (1, 1), (1, 1), (0, 0), (1, 1), 1, False),     # 1x1, batch 1 (no im2col)
    (2, 4, (10, 9), 6, (1, 1), (2, 2), (0, 0), (1, 1), 1, False),    # 1x1 stride 2 (shortcut)
    (2, 4, (9, 10), 6, (3, 3), (2, 2), (1, 1), (1, 1), 1, True),     # stride 2
    (2, 4, (11, 11), 6, (3, 3), (1, 1), (2, 2), (2, 2), 1, True),    # dilation 2
    (2, 4, (9, 9), 6, (3, 2), (2, 1), (2, 0), (2, 1), 2, True),      # groups 2, mixed params
    (2, 6, (8, 8), 6, (3, 3), (1, 1), (1, 1), (1, 1), 6, True),      # depthwise
    (2, 6, (8, 8), 12, (3, 3), (2, 2), (1, 1), (1, 1), 6, False),    # depthwise, multiplier 2
    (2, 4, (17,), 6, (5,), (2,), (2,), (1,), 1, True),              # 1-D
    (3, 4, (16,), 4, (3,), (1,), (2,), (2,), 2, False),             # 1-D grouped, dilated
    (1, 2, (5, 4, 6), 3, (3, 2, 3), (1, 2, 1), (1, 0, 1), (1, 1, 1), 1, True),  # 3-D
    (2, 3, (6, 7), 4, (1, 3), (1, 1), (1, 2), (1, 1), 1, True),     # padding past the taps
]


def _conv_inputs(case, dtype, layout, g):
    n, cin, sp, cout, k, s, p, d, groups, bias = case
    x = rnd((n, cin) + sp, dtype, g, -2, 2, "contig" if layout == "channels_last" else layout)
    if layout == "channels_last":
        x = x.contiguous(memory_format=torch.channels_last if len(sp) == 2 else
                         torch.channels_last_3d if len(sp) == 3 else torch.contiguous_format)
        if len(sp) == 1:    # channels last of a 1-D conv: [N, L, C] storage
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
    w = rnd((cout, cin // groups) + k, dtype, g, -1, 1)
    b = rnd((cout,), dtype, g) if bias else None
    return x, w, b, list(s), list(p), list(d), groups


@pytest.mark.parametrize("layout", ["contig", "channels_last", "slice"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", range(len(CONV_CASES)))
def test_convolution(case, dtype, layout):
    g = gen(hash((case, str(dtype), layout, "conv")) & 0xffff)
    x, w, b, s, p, d, groups = _conv_inputs(CONV_CASES[case], dtype, layout, g)
    args = (x, w, b, s, p, d, False, [0] * len(s), groups)
    k = run_op(A.convolution.default, args, tol=CONV_TOL[dtype])
    assert "extern" in k.kinds
    gy = rnd(A.convolution.default(*args).shape, dtype, g, -1, 1, "t")
    for mask in ([True, True, b is not None], [True, False, False], [False, True, False]):
        bargs = (gy, x, w, [w.shape[0]] if b is not None else None, s, p, d, False, [0] * len(s),
                 groups, mask)
        take = [i for i in range(3) if mask[i]]
        run_op(A.convolution_backward.default, bargs, nout=3, take=take, tol=CONV_TOL[dtype])


# The two roads of a float32 convolution (conv.c): oneDNN steps (the
# default when tccd is built with oneDNN) and, with TCC_NO_ONEDNN=1,
# im2col + GEMMs (OpenBLAS's, or tccd's own kernel where a GEMM has few
# rows against a [K, N] operand: plan_split_k). Each must match eager, and
# each must be the road taken: the generated source calls oneDNN's runtime
# or holds GEMMs.
ROAD_CASES = [0, 5, 7, 10, 12]   # 3x3 padded, stride 2, grouped + mixed, 1-D, 3-D


@pytest.mark.parametrize("road", ["onednn", "gemm"])
@pytest.mark.parametrize("case", ROAD_CASES)
def test_convolution_roads(case, road):
    g = gen(hash((case, road, "road")) & 0xffff)
    x, w, b, s, p, d, groups = _conv_inputs(CONV_CASES[case], torch.float32, "slice", g)
    env = dict(os.environ, TCC_NO_ONEDNN="1" if road == "gemm" else "0")
    args = (x, w, b, s, p, d, False, [0] * len(s), groups)
    gy = rnd(A.convolution.default(*args).shape, torch.float32, g, -1, 1, "t")
    bargs = (gy, x, w, [w.shape[0]] if b is not None else None, s, p, d, False, [0] * len(s),
             groups, [True, True, b is not None])
    for op, a, nout, take in ((A.convolution.default, args, None, None),
                              (A.convolution_backward.default, bargs, 3,
                               [0, 1, 2] if b is not None else [0, 1])):
        gm, ins = tk.op_graph(op, a, None, nout, take)
        k = tk.compile_fx(gm, ins, env=env, keep_source=True)
        if road == "onednn" and "onednn/" not in k.identity:
            pytest.skip("tccd is built without oneDNN (meson -Donednn)")
        uses_onednn = "tcc_dnnl_conv_run(&k" in k.source
        assert uses_onednn == (road == "onednn"), k.identity
        uses_gemms = "cblas_sgemm(" in k.source or "float *parts[" in k.source
        assert uses_gemms == (road == "gemm"), k.source
        want = op(*a)
        want = [want[i] for i in take] if nout else [want]
        for o, ref in zip(k(*ins), want):
            check(o, ref, tol=CONV_TOL[torch.float32])


@pytest.mark.parametrize("road", ["onednn", "gemm"])
def test_pointwise_convolution_is_one_batched_gemm(road):
    """A 1x1, stride-1, unpadded convolution on the CPU is one GEMM step
    batched over the images (conv.c, conv_pointwise_gemm): it reads x
    and writes C in y's [N, Cout, H*W] order, so with bias, inference
    batch norm and ReLU the artifact is that step and ONE epilogue kernel
    (no packing copy, no oneDNN convolution and its reorders), on both
    GEMM roads. Fresh inputs, against eager in float64."""
    g = gen(hash((road, "pointwise conv")) & 0xffff)
    x = rnd((3, 24, 7, 9), torch.float32, g, -2, 2)
    w, b = rnd((40, 24, 1, 1), torch.float32, g, -1, 1), rnd((40,), torch.float32, g)
    rm, rv = rnd((40,), torch.float32, g), rnd((40,), torch.float32, g, 0.5, 1.5)
    gamma, beta = rnd((40,), torch.float32, g), rnd((40,), torch.float32, g)

    def f(x, w, b, rm, rv, gamma, beta):
        y = A.convolution.default(x, w, b, [1, 1], [0, 0], [1, 1], False, [0, 0], 1)
        y = A._native_batch_norm_legit_no_training.default(y, gamma, beta, rm, rv, 0.1, 1e-5)[0]
        return A.relu.default(y)
    ins = [x, w, b, rm, rv, gamma, beta]
    gm = tk.aten_graph(f, ins, decompose=False)
    env = dict(os.environ, TCC_NO_ONEDNN="1" if road == "gemm" else "0")
    k = tk.compile_fx(gm, ins, env=env, keep_source=True)
    if road == "onednn" and "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN (meson -Donednn)")
    assert k.kinds == ["extern", "pointwise"], k.kinds
    assert "tcc_dnnl_conv_run(&k" not in k.source
    assert ("dnnl_sgemm(" in k.source) == (road == "onednn")
    assert ("cblas_sgemm(" in k.source) == (road == "gemm")
    want = f(*[t.double() for t in ins])
    torch.testing.assert_close(k(*ins)[0].double(), want, rtol=1e-4, atol=1e-4)


def test_channels_last_convolution_runs_on_brgemm_or_blocked(capfd):
    """A convolution on channels-last activations runs oneDNN's
    primitive on NHWC as it is unless that primitive is a direct JIT
    kernel ("jit:avx2": 1.1-1.9x slower on NHWC than on nChw8c at
    ResNet-50's 3x3 shapes), which runs on oneDNN's blocked layout with
    reorders in and out (onednn_conv.c); oneDNN 2's AVX2 3x3 kernels are
    such. The choice read from oneDNN's verbose log of the call; fresh
    inputs against eager in float64 either way."""
    import ctypes
    import ctypes.util
    g = gen(0xc1a5)
    x = rnd((2, 16, 12, 12), torch.float32, g, -2, 2).contiguous(memory_format=torch.channels_last)
    w = rnd((24, 16, 3, 3), torch.float32, g, -1, 1)
    args = (x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
    gm, ins = tk.op_graph(A.convolution.default, args)
    k = tk.compile_fx(gm, ins, keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN (meson -Donednn)")
    assert "tcc_dnnl_conv_run(&k" in k.source
    dnnl = ctypes.CDLL(ctypes.util.find_library("dnnl"))
    libc = ctypes.CDLL(None)
    capfd.readouterr()
    dnnl.dnnl_set_verbose(2)
    try:
        got = k(*ins)[0]
    finally:
        dnnl.dnnl_set_verbose(0)
        libc.fflush(None)
    log = capfd.readouterr().out
    convs = [ln.split(",") for ln in log.splitlines() if ",exec," in ln and ",convolution," in ln]
    assert len(convs) == 1, log
    f = convs[0]
    impl, src = f[f.index("convolution") + 1], next(x for x in f if x.startswith("src"))
    if "acdb" in src:
        assert not impl.startswith("jit:"), (impl, src)
    dnnl.dnnl_version.restype = ctypes.POINTER(ctypes.c_int)   # dnnl_version_t: major first
    if dnnl.dnnl_version()[0] == 2 and HOST_ISA == "x86-64-v3":
        assert "acdb" not in src and impl.startswith("jit:"), (impl, src)
    want = A.convolution.default(*[t.double() if isinstance(t, torch.Tensor) else t for t in args])
    torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)


def test_convolution_steps_run_on_threads_at_once():
    """A freshly loaded kernel's oneDNN steps make their primitives on the
    first call: 4 threads making that first call together (and 5 more
    calls each) all get eager's results, forward and backward, each
    thread with its own outputs and workspace."""
    import threading
    g = gen(0x5eed)
    x, w, b, s, p, d, groups = _conv_inputs(CONV_CASES[5], torch.float32, "contig", g)
    args = (x, w, b, s, p, d, False, [0] * len(s), groups)
    gy = rnd(A.convolution.default(*args).shape, torch.float32, g, -1, 1)
    bargs = (gy, x, w, [w.shape[0]], s, p, d, False, [0] * len(s), groups, [True, True, True])
    for op, a, nout in ((A.convolution.default, args, None), (A.convolution_backward.default, bargs, 3)):
        gm, ins = tk.op_graph(op, a, None, nout, None)
        k = tk.compile_fx(gm, ins, keep_source=True)
        if "onednn/" in k.identity:
            assert "tcc_dnnl_conv_run(&k" in k.source
        want = op(*a)
        want = list(want) if nout else [want]
        start, results, errors = threading.Barrier(4), [], []

        def run():
            try:
                ws = k.alloc_workspace()
                start.wait()
                for _ in range(6):
                    results.append(k(*ins, ws=ws))
            except Exception as e:   # surfaces in the assert below
                errors.append(e)

        threads = [threading.Thread(target=run) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors and len(results) == 24, errors
        for outs in results:
            for o, ref in zip(outs, want):
                check(o, ref, tol=CONV_TOL[torch.float32])


def test_convolution_unsupported_forms_are_refused():
    x, w = torch.randn(1, 2, 5, 5), torch.randn(2, 2, 3, 3)
    for dt in (torch.float16, torch.bfloat16):
        gm, ins = tk.op_graph(A.convolution.default,
                              (x.to(dt), w.to(dt), None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1))
        with pytest.raises(tk.CompileError) as e:
            tk.compile_fx(gm, ins)
        assert e.value.code == -12 and "aten.convolution.default" in e.value.message
        assert tk.PB_TO_TORCH and str(dt).split(".")[1] in e.value.message
    # transposed: the GEMM road (float64, or TCC_NO_ONEDNN=1) refuses it
    for dt, env in ((torch.float64, None), (torch.float32, dict(os.environ, TCC_NO_ONEDNN="1"))):
        gm, ins = tk.op_graph(A.convolution.default,
                              (x.to(dt), w.to(dt), None, [1, 1], [0, 0], [1, 1], True, [0, 0], 1))
        with pytest.raises(tk.CompileError) as e:
            tk.compile_fx(gm, ins, env=env)
        assert e.value.code == -12 and "transposed" in e.value.message


# Transposed convolutions (float32, oneDNN's deconvolution):
# (N, Cin, spatial, Cout, kernel, stride, padding, output_padding, dilation, groups, bias)
TRANSPOSED_CASES = [
    (2, 4, (5, 5), 6, (3, 3), (2, 2), (1, 1), (1, 1), (1, 1), 1, True),   # the usual 2x upsample
    (1, 3, (6, 7), 5, (3, 3), (1, 1), (1, 1), (0, 0), (1, 1), 1, False),  # stride 1
    (2, 4, (4, 5), 6, (4, 3), (2, 3), (1, 0), (0, 2), (1, 2), 2, True),   # groups, mixed
    (2, 4, (9,), 4, (5,), (2,), (2,), (1,), (1,), 1, True),              # 1-D
    (1, 2, (3, 4, 3), 3, (3, 2, 3), (2, 1, 2), (1, 0, 1), (1, 0, 0), (1, 1, 1), 1, True),  # 3-D
]


@pytest.mark.parametrize("layout", ["contig", "slice"])
@pytest.mark.parametrize("case", range(len(TRANSPOSED_CASES)))
def test_transposed_convolution(case, layout):
    n, cin, sp, cout, k, s, p, op, d, groups, bias = TRANSPOSED_CASES[case]
    g = gen(hash((case, layout, "transposed")) & 0xffff)
    x = rnd((n, cin) + sp, torch.float32, g, -2, 2, layout)
    w = rnd((cin, cout // groups) + k, torch.float32, g, -1, 1, layout)
    b = rnd((cout,), torch.float32, g) if bias else None
    args = (x, w, b, list(s), list(p), list(d), True, list(op), groups)
    gm, ins = tk.op_graph(A.convolution.default, args)
    k = tk.compile_fx(gm, ins, keep_source=True)
    if "onednn/" not in k.identity:
        pytest.skip("tccd is built without oneDNN: transposed convolutions are UNIMPLEMENTED")
    assert "tcc_dnnl_conv_run(&k" in k.source
    run_op(A.convolution.default, args, tol=CONV_TOL[torch.float32])
    gy = rnd(A.convolution.default(*args).shape, torch.float32, g, -1, 1, "t")
    for mask in ([True, True, b is not None], [True, False, False], [False, True, False]):
        bargs = (gy, x, w, [cout] if b is not None else None, list(s), list(p), list(d), True, list(op),
                 groups, mask)
        run_op(A.convolution_backward.default, bargs, nout=3, take=[i for i in range(3) if mask[i]],
               tol=CONV_TOL[torch.float32])


# ------------------------------------------------------ CPU attention
#
# _scaled_dot_product_flash_attention_for_cpu (+ backward), which the
# Python client keeps whole (its decomposition gives wrong gradients in
# torch 2.13): GEMM steps + fused softmax. float32 (1e-4, 1e-5), float64
# 1e-10 against eager's flash kernel.

ATTN = A._scaled_dot_product_flash_attention_for_cpu.default
ATTN_BW = A._scaled_dot_product_flash_attention_for_cpu_backward.default


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("form", ["plain", "causal", "cross_causal", "mask", "mask_bcast_scale",
                                  "batch1", "strided"])
def test_cpu_flash_attention(form, dtype):
    g = gen(hash((form, str(dtype), "attn")) & 0xffff)
    L, S, E = 16, (12 if form.startswith("cross") else 16), 8
    lead = (3, 4) if form != "batch1" else (1, 2)
    q = rnd(lead + (L, E), dtype, g, -2, 2)
    k = rnd(lead + (S, E), dtype, g, -2, 2)
    v = rnd(lead + (S, E), dtype, g, -2, 2)
    if form == "strided":   # q/k/v as nn.MultiheadAttention hands them: [B, L, H, E] transposed
        q = rnd((3, L, 4, E), dtype, g, -2, 2).transpose(1, 2)
        k = rnd((3, S, 4, E), dtype, g, -2, 2).transpose(1, 2)
    kw = {}
    if form == "mask":
        kw["attn_mask"] = rnd((L, S), dtype, g, -3, 1)
    if form == "mask_bcast_scale":
        kw["attn_mask"] = rnd((3, 1, L, S), dtype, g, -3, 1)
        kw["scale"] = 0.3
    causal = "causal" in form
    tol = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-10, 1e-10)}[dtype]
    k_ = run_op(ATTN, (q, k, v, 0.0, causal), kw, nout=2, tol=tol)
    assert k_.kinds.count("extern") == 2
    o, lse = ATTN(q, k, v, 0.0, causal, **kw)
    go = rnd(o.shape, dtype, g, -1, 1)
    run_op(ATTN_BW, (go, q, k, v, o, lse, 0.0, causal), kw, nout=3, tol=tol)


def test_cpu_flash_attention_dropout_is_refused():
    q = torch.randn(1, 2, 4, 8)
    gm, ins = tk.op_graph(ATTN, (q, q, q, 0.1, False), nout=2)
    with pytest.raises(tk.CompileError) as e:
        tk.compile_fx(gm, ins)
    assert e.value.code == -12 and "dropout" in e.value.message


# ------------------------------------------------------ dropout (training)
#
# native_dropout(x, p, train=True, *, seed): the client adds an int64
# tensor of one element, fresh per call. Mask mean: a binomial of n
# draws has standard deviation sqrt(p (1 - p) / n); the tests allow 6 of
# them (a false failure about once in 5e8 runs).

def _dropout_kernel(x, p, shape_seed=(), seed=True):
    """The kernel of native_dropout(x, p, True); the client's converter
    appends the seed input (tccd.graph.SEEDED_OPS)."""
    gm, ins = tk.op_graph(A.native_dropout.default, (x, p, True), nout=2)
    req = tk.request_for(gm, ins)
    assert req.graph.inputs[-1].endswith("__seed")
    sv = [v for v in req.graph.values if v.name == req.graph.inputs[-1]][0]
    sv.meta.sizes[:] = list(shape_seed)
    sv.meta.strides[:] = [1] * len(shape_seed)
    if not seed:
        del req.graph.inputs[-1]
        node = req.graph.nodes[0]
        keep = [a for a in node.inputs if a.name != "seed"]
        del node.inputs[:]
        node.inputs.extend(keep)
    return tk.compile_request(req)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5, 0.8])
def test_native_dropout_training(dtype, p):
    g = gen(hash((str(dtype), p, "dropout")) & 0xffff)
    x = rnd((64, 257), dtype, g, -3, 3, "t")
    k = _dropout_kernel(x, p)
    s1 = torch.randint(-2**62, 2**62, (), generator=g, dtype=torch.int64)
    s2 = s1 + 1
    y1, m1 = k(x, s1)
    y1b, m1b = k(x, s1.clone())
    y2, m2 = k(x, s2)
    assert m1.dtype == torch.bool and y1.dtype == dtype
    n = m1.numel()
    sd = (p * (1 - p) / n) ** 0.5
    for m in (m1, m2):
        assert abs(m.double().mean().item() - (1 - p)) <= 6 * sd, (m.double().mean().item(), 1 - p)
    assert torch.equal(m1, m1b) and torch.equal(y1, y1b), "same seed, same mask"
    assert not torch.equal(m1, m2), "seeds differ by one, masks must differ"
    # about p^2 + (1-p)^2 of the elements agree between independent masks
    agree = (m1 == m2).double().mean().item()
    assert abs(agree - (p * p + (1 - p) ** 2)) <= 6 * (0.25 / n) ** 0.5
    # the output is exactly eager's formula on that mask
    want = x * m1 * (1.0 / (1.0 - p))
    assert torch.equal(y1, want)
    # backward (decomposed by AOTAutograd into pointwise ops) with this mask
    go = rnd(x.shape, dtype, g)
    torch.testing.assert_close(A.native_dropout_backward.default(go, m1, 1.0 / (1 - p)),
                               go * m1 * (1.0 / (1 - p)), rtol=0, atol=0)
    # neighbouring elements are not correlated
    mf = m1.reshape(-1).double()
    cov = ((mf[1:] - mf.mean()) * (mf[:-1] - mf.mean())).mean().item()
    assert abs(cov) <= 6 * p * (1 - p) / (n - 1) ** 0.5


def test_native_dropout_edges():
    x = torch.randn(3, 5)
    y, m = _dropout_kernel(x, 0.0)(x, torch.tensor(7))
    assert m.all() and torch.equal(y, x)
    y, m = _dropout_kernel(x, 1.0)(x, torch.tensor(7))
    assert not m.any() and not y.any()
    # a seed of shape [1] works too; eval mode needs no seed
    y, m = _dropout_kernel(x, 0.5, (1,))(x, torch.tensor([7]))
    assert torch.equal(y, x * m * 2.0)
    run_op(A.native_dropout.default, (x, 0.5, False), nout=2)
    # train=True without a seed is refused, naming what is missing
    with pytest.raises(tk.CompileError) as e:
        _dropout_kernel(x, 0.5, seed=False)
    assert e.value.code == -12 and "seed" in e.value.message


# ------------------------------------------------------ bad graphs

def test_bad_graphs_get_clear_errors():
    x = torch.randn(2, 3)
    # a shape the op cannot produce
    gm, ins = tk.op_graph(A.sum.dim_IntList, (x, [1]))
    req = tk.request_for(gm, ins)
    out = [v for v in req.graph.values if v.name == req.graph.outputs[0]][0]
    out.meta.sizes[:] = [3]
    with pytest.raises(tk.CompileError) as e:
        tk.compile_request(req)
    assert "declared with shape [3]" in e.value.message
    # dims out of range
    gm, ins = tk.op_graph(A.sum.dim_IntList, (x, [1]))
    req = tk.request_for(gm, ins)
    req.graph.nodes[0].inputs[1].arg.as_ints.values[:] = [5]
    with pytest.raises(tk.CompileError) as e:
        tk.compile_request(req)
    assert "dim 5 out of range" in e.value.message
    # dropout in training is refused, not run wrongly
    gm, ins = tk.op_graph(A.dropout.default, (x, 0.5, True))
    with pytest.raises(tk.CompileError) as e:
        tk.compile_fx(gm, ins)
    assert "training mode" in e.value.message and e.value.code == -12


# ------------------------------------------------ 64-bit indexing

def test_large_offsets_use_64bit_indexing():
    # a strided view whose storage index passes 2^31 (a 2-element tensor
    # at a huge storage offset would need that much memory; instead check
    # the generated code indexes with int64_t)
    x = torch.randn(4, 8)
    gm, ins = tk.op_graph(A.add.Tensor, (x, x))
    k = tk.compile_fx(gm, ins, keep_source=True)
    assert "int64_t i0" in k.source and "int32_t i" not in k.source


@pytest.mark.parametrize("offset,scale", [(0.0, 1.0), (100.0, 1.0), (1e4, 1.0), (1e3, 0.1)])
def test_batch_norm_statistics_far_from_zero(offset, scale):
    """Training batch norm's one-pass statistics (sums of x - s and
    (x - s)^2 with s a channel's own first element) stay as close to
    float64 as eager's Welford statistics when the mean is far from
    zero and the spread small, where sums of x and x^2 would cancel."""
    g = gen(123)
    x = torch.randn(16, 8, 14, 14, generator=g) * scale + offset
    w, b = torch.randn(8, generator=g), torch.randn(8, generator=g)
    rm, rv = torch.randn(8, generator=g), torch.rand(8, generator=g) + 0.5
    args = (x, w, b, rm, rv, True, 0.1, 1e-5)
    gm, ins = tk.op_graph(A._native_batch_norm_legit_functional.default, args, nout=5)
    got = tk.compile_fx(gm, ins)(*ins)
    ref = A._native_batch_norm_legit_functional.default(*[a.double() if torch.is_tensor(a) else a for a in args])
    eager = A._native_batch_norm_legit_functional.default(*args)
    for i in range(5):   # output, mean, rstd, running mean, running var
        err = (got[i].double() - ref[i]).abs().max().item()
        err_eager = (eager[i].double() - ref[i]).abs().max().item()
        assert err <= max(4 * err_eager, 2e-6 * (ref[i].abs().max().item() + scale)), (i, err, err_eager)


def test_batch_norm_training_on_an_empty_batch():
    """An empty batch (eager refuses it) compiles and reads no element:
    the statistics are 0/0 (NaN), the running ones follow them, and the
    shift of the one-pass statistics reads nothing of the empty input."""
    g = gen(124)
    x = torch.empty(0, 3, 4, 4)
    w, b, rm, rv = rnd((3,), torch.float32, g), rnd((3,), torch.float32, g), rnd((3,), torch.float32, g), \
        rnd((3,), torch.float32, g, 0.5, 2)
    args = (x, w, b, rm, rv, True, 0.1, 1e-5)
    gm, ins = tk.op_graph(A._native_batch_norm_legit_functional.default, args, nout=5)
    out = tk.compile_fx(gm, ins)(*ins)
    assert out[0].shape == (0, 3, 4, 4)
    assert torch.isnan(out[1]).all() and torch.isnan(out[3]).all(), out
