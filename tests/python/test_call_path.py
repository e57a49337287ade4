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
