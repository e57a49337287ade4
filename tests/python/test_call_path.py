"""The steady-state call of a compiled graph (issue 21's per-call
overhead): a partition called with the layouts of its last call runs its
kernel's signature runner (Kernel.signature_runner), one generated Python
function that checks the guards and storage offsets and calls the
artifact; any other layout takes the general path. Results against
float64 on fresh random inputs (rtol 1e-5, atol 1e-6)."""
import sys

import torch

import tccd

F64 = dict(rtol=1e-5, atol=1e-6)


def sincos(x):
    return torch.sin(x) + torch.cos(x)


def ref(x):
    return sincos(x.double())


def package_frames(fn, *args):
    """The Python frames of tccd's package and of the code it generates
    that one call of fn(*args) enters."""
    names = []

    def prof(frame, event, arg):
        if event == "call":
            f = frame.f_code.co_filename
            if "/tccd/" in f or f.startswith("<tccd"):
                names.append(f"{f.rsplit('/', 1)[-1]}:{frame.f_code.co_name}")

    sys.setprofile(prof)
    try:
        fn(*args)
    finally:
        sys.setprofile(None)
    return names


def test_steady_call_is_few_frames(daemon):
    opt = torch.compile(sincos, backend="tccd")
    x = torch.randn(()) * 6
    for _ in range(3):
        torch.testing.assert_close(opt(x).double(), ref(x), **F64)
    frames = package_frames(opt, x)
    # the AOT output code, the graph's forward, the signature runner that
    # the forward finds in the partition's place: before, the graph's
    # runner, its lambda and the partition came between (and before them
    # the kernel's run with three comprehensions, the signature check and
    # its generator, nn.Module.__getattr__, the thread's error)
    assert len(frames) <= 3, frames
    assert frames[-1].startswith("<tccd kernel"), frames


def test_signature_runner_from_several_threads(daemon):
    """The runner's pointer arrays are per thread: threads calling one
    compiled graph at once (the kernel runs with the GIL released) each
    get the results of their own inputs."""
    import concurrent.futures

    opt = torch.compile(sincos, backend="tccd", dynamic=False)
    x0 = torch.randn(64, 64)
    torch.testing.assert_close(opt(x0).double(), ref(x0), **F64)

    def worker(seed):
        g = torch.Generator().manual_seed(seed)
        for _ in range(200):
            x = torch.randn(64, 64, generator=g)
            torch.testing.assert_close(opt(x).double(), ref(x), **F64)
        return True

    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        assert all(ex.map(worker, range(4)))


def test_signature_runner_falls_through_on_other_layouts(daemon):
    opt = torch.compile(sincos, backend="tccd", dynamic=False)
    base = torch.randn(8, 6)
    for _ in range(2):
        x = torch.randn(8, 6)
        torch.testing.assert_close(opt(x).double(), ref(x), **F64)
    # the same sizes, other strides and storage offsets: guards in Dynamo
    # may send these to the same graph; either way each result is right
    others = [base.t().contiguous().t(), torch.randn(9, 6)[1:], torch.randn(8, 12)[:, ::2]]
    for y in others:
        torch.testing.assert_close(opt(y).double(), ref(y), **F64)
    x = torch.randn(8, 6)
    torch.testing.assert_close(opt(x).double(), ref(x), **F64)
    assert tccd.stats()["fallback_ops"] == 0


def test_signature_runner_of_a_kernel(daemon):
    """Kernel.signature_runner on its own, for a hand-built sin(x) +
    cos(y): the kernel's outputs for inputs laid out as its signature;
    None, with nothing run, for other sizes, strides or storage offsets."""
    from torch._C._dynamo.guards import TensorGuards
    from test_package import _sin_cos_request

    c = tccd.Client(daemon.addr)
    k, _ = c.get_kernel(_sin_cos_request())
    x, y = torch.randn(10, 10), torch.randn(10, 10)
    guards = TensorGuards(x, y, dynamic_dims_sizes=[list(x.shape), list(y.shape)],
                          dynamic_dims_strides=[list(x.stride()), list(y.stride())])
    run = k.signature_runner(guards.check, (0, 0))
    for _ in range(3):
        x, y = torch.randn(10, 10), torch.randn(10, 10)
        out, = run(x, y)
        torch.testing.assert_close(out.double(), x.double().sin() + y.double().cos(), **F64)
    assert run(x.t(), y) is None                       # strides
    assert run(torch.randn(10, 11)[:, 1:].contiguous(), torch.randn(9, 10)) is None   # sizes
    shifted = torch.randn(101)[1:].view(10, 10)        # storage offset 1
    assert run(shifted, y) is None
    assert run(x.double(), y) is None                  # dtype
    c.close()


def test_large_outputs_reuse_a_free_storage(daemon):
    """An output of tccd.client.LARGE_OUTPUT_BYTES or more lands in the
    storage of the call before when nothing holds that storage any more
    (glibc maps blocks over 32 MB afresh on each allocation, every page
    faulted in again), and in a new one while a result, a view of it or
    autograd's saved tensor still holds it: those keep their values.
    Through the signature runner (one output) and the general path (an
    output and a view of it)."""
    from tccd.client import LARGE_OUTPUT_BYTES
    n = LARGE_OUTPUT_BYTES // 4 + 1024   # float32 elements: just over the bound
    g = torch.Generator().manual_seed(torch.seed() & 0xffffffff)

    def twice(x):
        return x * 2 + 1

    def with_view(x):
        y = x * 3 - 1
        return y, y[::2]

    for fn, check in ((twice, lambda x, out: torch.testing.assert_close(out.double(), x.double() * 2 + 1, **F64)),
                      (with_view, lambda x, out: (torch.testing.assert_close(out[0].double(), x.double() * 3 - 1, **F64),
                                                  torch.testing.assert_close(out[1], out[0][::2], rtol=0, atol=0)))):
        opt = torch.compile(fn, backend="tccd", dynamic=False)
        ptr = lambda out: (out[0] if isinstance(out, tuple) else out).data_ptr()
        for _ in range(3):   # compiled, then past the first calls
            x = torch.rand(n, generator=g) - 0.5
            check(x, opt(x))
        x = torch.rand(n, generator=g) - 0.5
        first = ptr(opt(x))                 # dropped at once: its storage is free
        x = torch.rand(n, generator=g) - 0.5
        kept = opt(x)
        check(x, kept)
        assert ptr(kept) == first, "a free large storage was not reused"
        x2 = torch.rand(n, generator=g) - 0.5
        other = opt(x2)                     # `kept` holds the storage: a new one
        check(x2, other)
        assert ptr(other) != ptr(kept)
        check(x, kept)                      # untouched by the call after
        del other
        view = kept[0][1:] if isinstance(kept, tuple) else kept[1:]
        before = view.clone()
        del kept
        x3 = torch.rand(n, generator=g) - 0.5
        check(x3, opt(x3))                  # a view alone still holds the storage
        assert torch.equal(view, before)
    assert tccd.stats()["fallback_ops"] == 0

    # autograd: a forward's large output saved for its backward is not
    # reused by the forward after it while that backward is still to run
    w = (torch.rand(n, generator=g) - 0.5).requires_grad_()
    opt = torch.compile(lambda w, x: ((w * x).exp() * x).sum(), backend="tccd", dynamic=False)
    for _ in range(3):
        x1, x2 = torch.rand(n, generator=g) - 0.5, torch.rand(n, generator=g) - 0.5
        w.grad = None
        (opt(w, x1) + opt(w, x2)).backward()
        want = sum((w.double() * x.double()).exp() * x.double() * x.double() for x in (x1, x2))
        torch.testing.assert_close(w.grad.double(), want, rtol=1e-5, atol=1e-6)
