"""torch.compile(backend="tccd") on functions: results against float64 (or
eager) references on fresh random inputs, what gets compiled, what falls
back, and how real graphs' features (layouts, scalars, aliases, mutation,
autograd modes, dynamic shapes, options) come through.

Tolerances: float32 results against a float64 reference, rtol 1e-5 atol
1e-6 (a handful of pointwise ops in float32); against float32 eager, rtol
1e-4 atol 1e-5."""
import json
import logging
import threading

import pytest
import torch

import tccd
from tccd._proto import tcc_pb2 as pb

from models import CachedAttention

F64 = dict(rtol=1e-5, atol=1e-6)
F32 = dict(rtol=1e-4, atol=1e-5)


def close64(got, ref_fn, *inputs):
    ref = ref_fn(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                   for t in inputs])
    torch.testing.assert_close(got.double(), ref, **F64)


def run_in_threads(fn, n):
    ts = [threading.Thread(target=fn) for _ in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def foo(x, y):
    return torch.sin(x) + torch.cos(y)


def test_foo_function(daemon):
    opt = torch.compile(foo, backend="tccd")
    for _ in range(3):
        x, y = torch.randn(10, 10), torch.randn(10, 10)
        close64(opt(x, y), foo, x, y)
    s = tccd.stats()
    assert s["graphs"] == 1 and s["ops"] == 3
    # foo is pure pointwise: nothing falls back
    assert s["fallback_ops"] == 0, tccd.fallback_ops()
    assert s["compiled_ops"] == 3 and s["partitions"] == 1 and s["kernels"] == 1
    assert tccd.fallback_ops() == {}


def test_foo_decorator(daemon):
    @torch.compile(backend="tccd")
    def foo2(x, y):
        return torch.sin(x) + torch.cos(y)

    x, y = torch.randn(7, 3), torch.randn(7, 3)
    close64(foo2(x, y), foo, x, y)
    assert tccd.stats()["fallback_ops"] == 0


def test_linear_relu_module(daemon):
    torch.manual_seed(torch.initial_seed())
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())
    ref_m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU())
    ref_m.load_state_dict(m.state_dict())
    cm = torch.compile(m, backend="tccd")
    x = torch.randn(8, 16)
    out = cm(x)
    torch.testing.assert_close(out, ref_m(x), **F32)
    g = torch.randn_like(out)
    out.backward(g)
    ref_m(x).backward(g)
    for (n, p), q in zip(m.named_parameters(), ref_m.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **F32, msg=lambda s: f"{n}: {s}")
    s = tccd.stats()
    assert s["compiled_ops"] >= 1, s   # relu at least
    print("fallback:", tccd.fallback_ops())


def test_data_dependent_control_flow(daemon):
    def f(x):
        if x.sum() < 10:
            return torch.sin(x) * 2
        return torch.cos(x) - 1

    opt = torch.compile(f, backend="tccd")
    lo = torch.randn(16) - 3          # sum ~ -48
    hi = torch.randn(16) + 3          # sum ~ +48
    assert lo.sum() < 10 < hi.sum()
    close64(opt(lo), lambda x: torch.sin(x) * 2, lo)
    close64(opt(hi), lambda x: torch.cos(x) - 1, hi)


def bar(a, b):
    x = a / (torch.abs(a) + 1)
    if b.sum() < 0:
        b = b * -1
    return x * b


def test_bar_both_branches(daemon):
    opt = torch.compile(bar, backend="tccd")
    a = torch.randn(10)
    neg = -torch.rand(10) - 0.1
    pos = torch.rand(10) + 0.1
    close64(opt(a, neg), bar, a, neg)
    close64(opt(a, pos), bar, a, pos)
    # and again, now both branches are compiled
    a = torch.randn(10)
    close64(opt(a, neg), bar, a, neg)
    close64(opt(a, pos), bar, a, pos)
    assert tccd.stats()["compiled_ops"] > 0


def test_fullgraph_raises_on_graph_break(daemon):
    opt = torch.compile(bar, backend="tccd", fullgraph=True)
    with pytest.raises(torch._dynamo.exc.Unsupported):
        opt(torch.randn(10), torch.randn(10))


def test_noncontiguous_and_broadcast_inputs(daemon):
    def f(x, y, z):
        return torch.sin(x) * y + torch.exp(z)

    opt = torch.compile(f, backend="tccd")
    base = torch.randn(12, 20)
    x = base.t()                               # transposed
    y = torch.randn(20, 24)[:, ::2]            # strided columns
    z = torch.randn(12).expand(20, 12)         # broadcast (stride 0)
    w = torch.randn(40, 12)[5:25]              # storage offset
    assert not x.is_contiguous() and not y.is_contiguous() and z.stride(0) == 0
    close64(opt(x, y, z), f, x, y, z)
    close64(opt(w, y, z), f, w, y, z)
    # broadcasting inside the graph: (20, 12) op (12,) op (20, 1)
    u, v = torch.randn(12), torch.randn(20, 1)
    close64(opt(x, u, v), f, x, u, v)
    assert tccd.stats()["fallback_ops"] == 0


def test_python_scalars(daemon):
    def f(x, s):
        return torch.tanh(x) * s + 0.5 - s / 3

    opt = torch.compile(f, backend="tccd")
    for s in (2.5, -1.25, 3):
        x = torch.randn(6, 5)
        close64(opt(x, s), f, x, s)


def test_multiple_outputs_and_aliases(daemon):
    def f(x, y):
        s = torch.sin(x)
        return s, s.t(), y.view(-1), x, torch.cos(y) * 2

    opt = torch.compile(f, backend="tccd")
    x, y = torch.randn(3, 4), torch.randn(2, 6)
    got = opt(x, y)
    ref = f(x, y)
    assert len(got) == 5
    for g, r in zip(got, ref):
        torch.testing.assert_close(g, r, **F32)
        assert g.shape == r.shape and g.stride() == r.stride()
    # aliasing as in eager: the view of an input is still a view of it,
    # the returned input is the input, the transposed output shares s
    assert got[2].untyped_storage().data_ptr() == y.untyped_storage().data_ptr()
    assert got[3] is x
    assert got[1].untyped_storage().data_ptr() == got[0].untyped_storage().data_ptr()


def test_inplace_ops_and_input_mutation(daemon):
    def f(x, y):
        y = y.clone()
        y.add_(x)
        y.mul_(2)
        return torch.sin(y)

    def g(x):
        x.mul_(2)
        x.add_(1)
        return torch.cos(x)

    x, y = torch.randn(5, 5), torch.randn(5, 5)
    close64(torch.compile(f, backend="tccd")(x, y), f, x, y)
    a = torch.randn(5, 5)
    a_ref = a.clone().double()
    out = torch.compile(g, backend="tccd")(a)
    ref = g(a_ref)
    torch.testing.assert_close(out.double(), ref, **F64)
    torch.testing.assert_close(a.double(), a_ref, **F64)   # the input was mutated the same way


def test_cache_rows_written_in_place(daemon):
    """The graph's functional index_put of each cache becomes index_put_
    on the cache itself (partition.write_in_place), compiled in the one
    partition that reads the cache: no step copies a whole cache,
    nothing falls back, and outputs and caches match eager step after
    step, in the same storage. A cache also read elsewhere in
    the graph, and an index_put of an input the graph does not mutate,
    stay functional (and right)."""
    torch.manual_seed(0)
    ref = CachedAttention()
    mod = CachedAttention()
    mod.load_state_dict(ref.state_dict())
    opt = torch.compile(mod, backend="tccd")
    ptr = mod.k.data_ptr()
    with torch.no_grad():
        for step in (3, 4, 5, 11):
            x, pos = torch.randn(1, 1, 16), torch.tensor([step])
            torch.testing.assert_close(opt(x, pos), ref(x, pos), **F32)
            torch.testing.assert_close(mod.k, ref.k, **F32)
            torch.testing.assert_close(mod.v, ref.v, **F32)
    assert mod.k.data_ptr() == ptr
    (g,) = tccd.stats()["graphs_detail"]
    assert g["writes_in_place"] == 2 and g["fallback_ops"] == 0, g
    assert g["eager_writes_in_place"] == 0 and g["partitions"] == 1, g   # compiled with the attention

    def reads_old(c, i, rows):
        before = c.sum(-1)              # the old cache, read after the write in a reordered graph
        c.index_copy_(0, i, rows)
        return before, c * 2

    c = torch.randn(6, 5)
    c_ref = c.clone()
    i, rows = torch.tensor([2, 4]), torch.randn(2, 5)
    with torch.no_grad():
        got = torch.compile(reads_old, backend="tccd")(c, i, rows)
        want = reads_old(c_ref, i, rows)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **F32)
    torch.testing.assert_close(c, c_ref, **F32)

    def functional(c, i, rows):
        return c.index_put((i,), rows) + 1

    c2 = torch.randn(6, 5)
    c2_before = c2.clone()
    with torch.no_grad():
        out = torch.compile(functional, backend="tccd")(c2, i, rows)
    torch.testing.assert_close(out, functional(c2_before, i, rows), **F32)
    assert torch.equal(c2, c2_before)
    details = tccd.stats()["graphs_detail"]
    assert [d["writes_in_place"] for d in details] == [2, 0, 0], details


def _anon_huge_kb(ptr):
    """AnonHugePages of the mapping of this process that holds ptr."""
    inside = False
    for line in open("/proc/self/smaps"):
        head = line.split()[0] if line.strip() else ""
        if "-" in head and ":" not in head:
            lo, hi = (int(v, 16) for v in head.split("-"))
            inside = lo <= ptr < hi
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


def test_inference_weights_collapsed_into_huge_pages(daemon):
    """An inference graph's first call has its parameters' storages (16 MB
    each here) collapsed into 2 MB pages where they lie, on a thread of
    their own (hugepages.py): the weights' mapping then holds huge pages,
    the outputs match eager before and after, the addresses are the same,
    and later calls and huge_pages=False collapse nothing."""
    from tccd import hugepages
    torch.manual_seed(0)

    def mlp():
        return torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.GELU(),
                                   torch.nn.Linear(4096, 1024)).eval()
    m, x = mlp(), torch.randn(3, 1024)
    ptr = m[0].weight.data_ptr()
    before = tccd.stats()
    with torch.no_grad():
        y = torch.compile(m, backend="tccd")(x)
        torch.testing.assert_close(y, m(x), **F32)
    assert hugepages.wait(120)              # the collapsing thread runs beside the calls
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend="tccd")(x), m(x), **F32)
    after = tccd.stats()
    if hugepages._off or (after["huge_page_bytes"] == before["huge_page_bytes"] and after["huge_page_failures"] > before["huge_page_failures"]):
        pytest.skip("this kernel collapses no pages now (no MADV_COLLAPSE, or no free huge page)")
    assert after["huge_page_bytes"] - before["huge_page_bytes"] >= 2 * 12 * (1 << 20), (before, after)
    assert _anon_huge_kb(ptr) >= 12 * 1024 and m[0].weight.data_ptr() == ptr
    with torch.no_grad():
        torch.compile(m, backend="tccd")(torch.randn(3, 1024))      # the same storages: not again
        m2 = mlp()
        torch.compile(m2, backend="tccd", options={"huge_pages": False})(x)
    assert hugepages.wait(120)
    assert tccd.stats()["huge_page_bytes"] == after["huge_page_bytes"]   # (m2's memory may be reused
    # pages an earlier test's collapse left huge: its mapping says nothing here)


def test_requires_grad_inputs(daemon):
    def f(x, y):
        return (torch.sin(x) * torch.sigmoid(y) + torch.exp(-x * x)).sum()

    opt = torch.compile(f, backend="tccd")
    x = torch.randn(8, 8, requires_grad=True)
    y = torch.randn(8, 8, requires_grad=True)
    xr = x.detach().double().requires_grad_()
    yr = y.detach().double().requires_grad_()
    out = opt(x, y)
    ref = f(xr, yr)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    out.backward()
    ref.backward()
    torch.testing.assert_close(x.grad.double(), xr.grad, **F64)
    torch.testing.assert_close(y.grad.double(), yr.grad, **F64)
    kinds = {g["kind"] for g in tccd.stats()["graphs_detail"]}
    assert kinds == {"forward", "backward"}


def test_no_grad_and_inference_mode(daemon):
    m = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh())
    cm = torch.compile(m, backend="tccd")
    x = torch.randn(4, 6)
    with torch.no_grad():
        ref = m(x)
        torch.testing.assert_close(cm(x), ref, **F32)
    with torch.inference_mode():
        x2 = torch.randn(4, 6)
        torch.testing.assert_close(cm(x2), m(x2), **F32)
    assert all(g["kind"] == "inference" for g in tccd.stats()["graphs_detail"])


def test_dynamic_shapes_one_kernel_for_all_sizes(daemon):
    opt = torch.compile(foo, backend="tccd", dynamic=True)
    for n in (5, 7, 9, 7):
        x, y = torch.randn(n, 3), torch.randn(n, 3)
        close64(opt(x, y), foo, x, y)
    s = tccd.stats()
    assert s["graphs"] == 1            # one symbolic graph
    assert s["kernels"] == 1           # one dynamic-shape kernel serves every size
    assert s["dynamic_kernels"] == 1
    assert s["fallback_ops"] == 0


def test_transposed_convolution_trains(daemon):
    """ConvTranspose2d (stride 2, output_padding) + ReLU, forward and
    backward: every op compiled (the daemon's oneDNN deconvolution) when
    the daemon has oneDNN, and the output and gradients match eager either
    way (float32, 1e-5)."""
    m = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1),
                            torch.nn.ReLU())
    x = torch.randn(2, 4, 5, 5, requires_grad=True)
    y = torch.compile(m, backend="tccd")(x)
    y.square().sum().backward()
    got = [y.detach(), x.grad, m[0].weight.grad, m[0].bias.grad]
    x.grad = None
    m.zero_grad(set_to_none=True)
    want = m(x)
    want.square().sum().backward()
    for a, b in zip(got, [want.detach(), x.grad, m[0].weight.grad, m[0].bias.grad]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    if "onednn/" in tccd.Client().ops().compiler:
        assert tccd.stats()["fallback_ops"] == 0, tccd.fallback_ops()


def _trains_as_eager(m, x):
    """m compiled by tccd: its output and the gradients of x and of every
    parameter match eager's (float32, 1e-5)."""
    y = torch.compile(m, backend="tccd")(x)
    y.square().sum().backward()
    params = list(m.parameters())
    got = [y.detach(), x.grad] + [p.grad for p in params]
    x.grad = None
    m.zero_grad(set_to_none=True)
    want = m(x)
    want.square().sum().backward()
    for a, b in zip(got, [want.detach(), x.grad] + [p.grad for p in params]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_channels_last_cnn_trains(daemon):
    """A channels_last CNN (conv, tanh, global average pool, linear):
    AOTAutograd restrides the pooled mean with as_strided and builds its
    gradient with as_strided_scatter into a fresh buffer; every op is
    compiled, and the output and gradients match eager (float32, 1e-5)."""
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Tanh(),
                            torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(),
                            torch.nn.Linear(8, 5)).to(memory_format=torch.channels_last)
    x = torch.randn(4, 3, 6, 6).contiguous(memory_format=torch.channels_last).requires_grad_()
    _trains_as_eager(m, x)
    if "onednn/" in tccd.Client().ops().compiler:
        assert tccd.stats()["fallback_ops"] == 0, tccd.fallback_ops()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend="tccd")(x), m(x), rtol=1e-5, atol=1e-5)


def test_conv_network_saves_activations_channels_last(daemon):
    """A training step of a convolution network (conv, batch norm, relu,
    a residual 1x1 branch, max pool; NCHW parameters and input): the
    forward saves its 4-D activations for the backward channels last, as
    Inductor's layout optimization does, and AOTAutograd traces the
    backward so, so each partition compiles once (no second signature on
    the first backward). The user-visible feature map keeps eager's NCHW
    layout; outputs and gradients match eager (float32, 1e-4) over two
    steps."""
    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c1, self.b1 = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.BatchNorm2d(16)
            self.c2, self.b2 = torch.nn.Conv2d(16, 16, 3, padding=1, bias=False), torch.nn.BatchNorm2d(16)
            self.c3 = torch.nn.Conv2d(16, 16, 1, bias=False)
            self.pool, self.fc = torch.nn.MaxPool2d(2), torch.nn.Linear(16, 5)

        def forward(self, x):
            y = torch.relu(self.b1(self.c1(x)))
            z = torch.relu(self.b2(self.c2(y)) + self.c3(y))
            f = self.pool(z)
            return self.fc(f.mean((2, 3))), f

    torch.manual_seed(0)
    m, ref = Net(), Net()
    ref.load_state_dict(m.state_dict())
    opt = torch.compile(m, backend="tccd")
    saved = []

    def pack(t):
        saved.append(t)
        return t
    for step in range(2):
        x, c = torch.randn(4, 3, 12, 12), torch.randn(4, 16, 6, 6)
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out, feat = opt(x)
        (out.square().sum() + (feat * c).sum()).backward()
        want, wfeat = ref(x)
        (want.square().sum() + (wfeat * c).sum()).backward()
        assert feat.is_contiguous()
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(feat, wfeat, rtol=1e-4, atol=1e-4)
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4)
        m.zero_grad(set_to_none=True)
        ref.zero_grad(set_to_none=True)
    acts = [t for t in saved if t.dim() == 4 and t.is_floating_point() and t.shape[0] == 4 and t.shape[1] == 16]
    assert acts and all(t.is_contiguous(memory_format=torch.channels_last) for t in acts), \
        [(tuple(t.shape), t.stride()) for t in acts]
    s = tccd.stats()
    if "onednn/" in tccd.Client().ops().compiler:
        assert s["fallback_ops"] == 0, tccd.fallback_ops()
    kinds = [g["kind"] for g in s["graphs_detail"]]
    assert sorted(kinds) == ["backward", "forward"], kinds
    assert s["kernels"] == sum(g.get("partitions", 0) for g in s["graphs_detail"]), s


def test_pooling_cnn_trains(daemon):
    """ResNet's stem (conv, batch-free tanh, 3x3/2 max pool with padding)
    and a 2x2 average pool, channels_last and not: every op compiled (the
    pools forward and backward), output and gradients as eager's
    (float32, 1e-5)."""
    for fmt in (torch.contiguous_format, torch.channels_last):
        torch._dynamo.reset()
        tccd.reset_stats()
        m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.Tanh(),
                                torch.nn.MaxPool2d(3, 2, 1), torch.nn.AvgPool2d(2),
                                torch.nn.Flatten(), torch.nn.Linear(8 * 3 * 3, 5)).to(memory_format=fmt)
        x = torch.randn(4, 3, 12, 12).contiguous(memory_format=fmt).requires_grad_()
        _trains_as_eager(m, x)
        if "onednn/" in tccd.Client().ops().compiler:
            assert tccd.stats()["fallback_ops"] == 0, (fmt, tccd.fallback_ops())


def test_adaptive_pool_cnn_trains(daemon):
    """A torchvision-style head, AdaptiveAvgPool2d to 4x4 (7x7 input:
    windows of 2 and 3 that overlap) and to 1x1, trains with every op
    compiled, the pools forward and backward; output and gradients as
    eager's (float32, 1e-5)."""
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                            torch.nn.AdaptiveAvgPool2d(4), torch.nn.Conv2d(8, 8, 1), torch.nn.Tanh(),
                            torch.nn.AdaptiveAvgPool2d((1, 1)), torch.nn.Flatten(), torch.nn.Linear(8, 5))
    x = torch.randn(4, 3, 7, 7).requires_grad_()
    _trains_as_eager(m, x)
    if "onednn/" in tccd.Client().ops().compiler:
        assert tccd.stats()["fallback_ops"] == 0, tccd.fallback_ops()


def test_float64_compiles_integers_fall_back(daemon):
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.randn(4, 4, dtype=torch.float64)
    out = torch.compile(foo, backend="tccd")(x, y)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, foo(x, y), rtol=1e-12, atol=1e-12)
    assert tccd.stats()["fallback_ops"] == 0

    torch._dynamo.reset()
    tccd.reset_stats()

    def h(a, b):
        return (a + b) * 3 - a

    a = torch.randint(-100, 100, (6,))
    b = torch.randint(-100, 100, (6,))
    assert torch.equal(torch.compile(h, backend="tccd")(a, b), h(a, b))


def test_constant_tensor_in_graph(daemon):
    def f(x):
        c = torch.tensor([1.5, -2.0, 3.25])
        return x * c + torch.sin(c)

    x = torch.randn(4, 3)
    close64(torch.compile(f, backend="tccd")(x), f, x)
    assert tccd.stats()["fallback_ops"] == 0


def test_threads_share_compiled_function(daemon):
    opt = torch.compile(foo, backend="tccd")
    x, y = torch.randn(64, 64), torch.randn(64, 64)
    close64(opt(x, y), foo, x, y)          # compile once, in this thread
    errors = []

    def work():
        try:
            for _ in range(50):
                a, b = torch.randn(64, 64), torch.randn(64, 64)
                torch.testing.assert_close(opt(a, b).double(), foo(a.double(), b.double()), **F64)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    run_in_threads(work, 4)
    assert not errors, errors[0]


def test_parallel_kernels_keep_torch_threads(daemon):
    """A graph big enough for parallel loops runs under the thread governor,
    which times calls on all threads and on one (omp_set_num_threads for
    the call): every call is right, from several Python threads at once
    too, and PyTorch's thread count is the same afterwards."""
    threads = torch.get_num_threads()
    opt = torch.compile(foo, backend="tccd")
    errors = []

    def work():
        try:
            for _ in range(12):
                a, b = torch.randn(512, 512), torch.randn(512, 512)
                close64(opt(a, b), foo, a, b)
                assert torch.get_num_threads() == threads
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    work()                                 # compile, and the governor's first calls
    run_in_threads(work, 3)
    assert not errors, errors[0]
    assert torch.get_num_threads() == threads
    assert tccd.stats()["kernels"] >= 1


def test_info_log_once_per_graph(daemon, caplog):
    caplog.set_level(logging.INFO, logger="tccd")

    def f(x):
        return torch.sin(x).cumprod(0) * 2

    opt = torch.compile(f, backend="tccd")
    for _ in range(3):
        x = torch.randn(9)
        torch.testing.assert_close(opt(x), f(x), **F32)
    lines = [r.getMessage() for r in caplog.records
             if r.name == "tccd" and r.levelno == logging.INFO and "fall back" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "aten.cumprod.default" in lines[0] and "1 fall back" in lines[0]


def test_debug_log_explains_a_miss(own_daemon, caplog):
    """TORCH_LOGS=tccd at debug: a kernel that missed the cache is explained
    by the daemon: another batch size names the input sizes that differ."""
    own_daemon()
    caplog.set_level(logging.DEBUG, logger="tccd")

    def f(x):
        return torch.sin(x) * 2 + x

    opt = torch.compile(f, backend="tccd", dynamic=False)
    for rows in (4, 6):
        x = torch.randn(rows, 5)
        torch.testing.assert_close(opt(x), f(x), **F32)
    lines = [r.getMessage() for r in caplog.records if r.name == "tccd"]
    explained = [m for m in lines if "explained:" in m]
    assert len(explained) == 2, lines
    assert "no other entry or recorded failure shares the graph" in explained[0]
    assert "input 0 sizes: [6, 5] vs [4, 5]" in explained[1], explained[1]
    assert any("input 0 sizes: [6, 5] vs [4, 5]" in m for m in lines if m.startswith("tccd:   "))


def _entries_options(d):
    out = []
    for e in d.tcctl("ls", "--limit", "1000")["entries"]:
        out.append(d.tcctl("show", e["guard_hash"])["options"])
    return out


@pytest.mark.parametrize("route", ["torch_compile_mode", "backend_option", "options_dict"])
def test_mode_reaches_the_daemon(own_daemon, route):
    d = own_daemon()
    if route == "torch_compile_mode":
        opt = torch.compile(foo, backend="tccd", mode="max-autotune")
        want = "MAX_AUTOTUNE"
    elif route == "backend_option":
        opt = torch.compile(foo, backend=tccd.backend(mode="reduce-overhead"))
        want = "REDUCE_OVERHEAD"
    else:
        opt = torch.compile(foo, backend="tccd", options={"mode": "max-autotune-no-cudagraphs"})
        want = "MAX_AUTOTUNE_NO_CUDAGRAPHS"
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    close64(opt(x, y), foo, x, y)
    modes = {o["mode"] for o in _entries_options(d)}
    assert modes == {want}, modes


def test_dynamic_and_fullgraph_reach_the_daemon(own_daemon):
    d = own_daemon()
    opt = torch.compile(foo, backend="tccd", dynamic=True, fullgraph=True)
    x, y = torch.randn(3, 3), torch.randn(3, 3)
    close64(opt(x, y), foo, x, y)
    opts = _entries_options(d)
    assert opts and all(o["dynamic"] for o in opts), opts
    assert all(o["fullgraph"] for o in opts), opts


def test_boolean_mask_assignment_compiles(daemon):
    """x[mask] = value (aten.index_put with one boolean mask and one value)
    compiles as a select: the tutorial's numpy program writes
    X_std[X_std == 0] = 1. Masks over the leading dims, accumulate=True and
    float64 included; a mask with several values falls back, right."""
    def numpy_like(x):
        x_std = x * 2.0
        x_std[x_std == 0] = 1
        return x_std + 1

    def leading_mask(x, m):
        y = x.clone()
        y[m] = 3.5
        return y.sin()

    def accumulate(x, m):
        y = x.clone()
        y.index_put_((m,), torch.tensor(2.0), accumulate=True)
        return y

    def many_values(x, m, v):
        y = x.clone()
        y[m] = v            # one value per selected element: runs eagerly
        return y * 2

    cases = [(numpy_like, lambda: (torch.randint(-2, 3, (64, 33)).double(),), 0),
             (leading_mask, lambda: (torch.randn(8, 5, 7), torch.rand(8, 5) > 0.5), 0),
             (accumulate, lambda: (torch.randn(6, 9), torch.rand(6, 9) > 0.3), 0),
             (many_values, lambda: (torch.randn(4, 4), torch.eye(4, dtype=torch.bool), torch.randn(4)), 1)]
    for fn, make, fallbacks in cases:
        torch._dynamo.reset()
        tccd.reset_stats()
        opt = torch.compile(fn, backend="tccd")
        for _ in range(2):
            args = make()
            torch.testing.assert_close(opt(*args), fn(*args), **F64)   # sin: libmvec vs ATen, 1 ulp
        fb = tccd.fallback_ops()
        assert sum(fb.values()) == fallbacks, (fn.__name__, fb)
        assert tccd.stats()["compiled_ops"] > 0, fn.__name__


def test_numpy_faq_program_compiles_whole(daemon):
    """The torch.compile FAQ's numpy program (numpy arrays in and out):
    column mean and std, X_std[X_std == 0] = 1, standardize, the outer
    product einsum('ij,ik->ijk') summed over the last two dims. Fresh
    random inputs, one constant column in each call (its std is 0, so the
    mask's branch is taken), against numpy itself in float64; every op
    compiled."""
    import numpy as np

    def numpy_fn(X, Y):
        X_mean, X_std = X.mean(axis=0), X.std(axis=0)
        Y_mean, Y_std = Y.mean(axis=0), Y.std(axis=0)
        X_std[X_std == 0] = 1
        Y_std[Y_std == 0] = 1
        X_normalized = (X - X_mean) / X_std
        Y_normalized = (Y - Y_mean) / Y_std
        return np.einsum("ij,ik->ijk", X_normalized, Y_normalized).sum(axis=(-2, -1))

    torch._dynamo.reset()
    tccd.reset_stats()
    opt = torch.compile(numpy_fn, backend="tccd")
    rng = np.random.default_rng()
    for _ in range(2):
        X, Y = rng.standard_normal((96, 40)) * 3 + 1, rng.standard_normal((96, 40))
        X[:, rng.integers(40)] = 2.5
        want = numpy_fn(X.copy(), Y.copy())
        got = opt(X, Y)
        assert isinstance(got, np.ndarray) and got.dtype == np.float64, type(got)
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10 * np.abs(want).max())
    assert sum(tccd.fallback_ops().values()) == 0, tccd.fallback_ops()
    assert tccd.stats()["compiled_ops"] > 0


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_activations_go_channels_last_on_the_cpu_only(device):
    """The forward of a convolution network's training step saves its
    activations channels last on the CPU (oneDNN reads them so); on CUDA
    it keeps them NCHW: cuDNN would transpose them back and tccd's
    per-channel reductions would read NHWC across their threads. The
    graph is traced on fake tensors, so CUDA needs no GPU."""
    import types
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from tccd import dynamo

    def fwd(x, w):       # (user output, saved activation, saved input)
        y = torch.relu(torch.ops.aten.convolution.default(x, w, None, [1, 1], [1, 1], [1, 1],
                                                          False, [0, 0], 1))
        return y.sum(), y, x

    mode = FakeTensorMode()
    with mode:
        gm = make_fx(fwd)(torch.empty(2, 3, 8, 8, device=device), torch.empty(4, 3, 3, 3, device=device))
    tc = TracingContext(mode)
    tc.fw_metadata = types.SimpleNamespace(tensors_saved_for_backwards_slice=slice(1, 3))
    tc.output_strides = []
    with tracing(tc):
        chosen = dynamo._channels_last_activations(gm)
    if device == "cpu":
        assert chosen == (1,) and tc.output_strides[1] == (256, 1, 32, 4), (chosen, tc.output_strides)
    else:
        assert chosen == () and tc.output_strides == [], (chosen, tc.output_strides)
