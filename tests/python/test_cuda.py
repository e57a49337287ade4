"""CUDA tensors through the backend (option cuda="compile", the default;
TCCD_CUDA=eager runs them eagerly).

Without a GPU (this machine, CI): a graph traced on fake CUDA tensors goes
through the backend's setup in a child process whose libtccclient is bound
to the recording fake libcuda/libcublas (tests/cuda): the daemon compiles
the partition for the device's arch (NVRTC), the package loads the cubin
through libtccclient, and a launch on a stream runs the manifest's launch plan
with the package's pointers, in order. Skipped when the build has no NVRTC.

With a GPU (torch.cuda.is_available()): three training steps of every
benchmark model on CUDA tensors against the model in float64, and the
default backend string; run there by scripts/gpu-check --prebuilt.
"""
import copy
import json
import os
import subprocess
import sys

import pytest
import torch

import tccd
from conftest import BUILD, SOURCE
from kinks import explain_by_relu_kinks

FAKE_CUDA = os.path.join(BUILD, "tests", "cuda", "libfakecuda.so")
FAKE_CUBLAS = os.path.join(BUILD, "tests", "cuda", "libfakecublas.so")
FAKE_CUDNN = os.path.join(BUILD, "tests", "cuda", "libfakecudnn.so")
HERE = os.path.dirname(os.path.abspath(__file__))


def test_cuda_option_defaults_to_compile_and_is_validated(monkeypatch):
    monkeypatch.delenv("TCCD_CUDA", raising=False)
    assert tccd.config.Config.make().cuda == "compile"
    monkeypatch.setenv("TCCD_CUDA", "eager")
    assert tccd.config.Config.make().cuda == "eager"
    with pytest.raises(ValueError, match="cuda must be one of"):
        tccd.config.Config.make(cuda="yes")


def run_fake_cuda_child(daemon, nparams, **env):
    """cuda_child.py against the recording fake libcuda/libcublas: its
    JSON report (skips when the daemon has no NVRTC). nparams: the
    parameters every kernel takes (inputs, outputs, workspace)."""
    env = dict(os.environ, TCC_CUDA_LIBRARY=FAKE_CUDA, TCC_CUBLAS_LIBRARY=FAKE_CUBLAS, TCC_CUDNN_LIBRARY=FAKE_CUDNN,
               TCC_FAKE_CUDA_CC="90", TCCD_ADDR=daemon.addr, TCC_FAKE_CUDA_NPARAMS=str(nparams),
               TCC_PKG=os.path.join(SOURCE, "client", "python"), **env)
    p = subprocess.run([sys.executable, os.path.join(HERE, "cuda_child.py")], env=env,
                       capture_output=True, text=True, timeout=300)
    if p.returncode != 0 and "NVRTC not available" in p.stderr:
        pytest.skip("this build's daemon has no NVRTC (scripts/setup-cuda)")
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(next(l for l in p.stdout.splitlines() if l.startswith("REPORT "))[len("REPORT "):])


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA), reason="fake libcuda not built")
def test_cuda_graph_compiles_and_launches_through_the_loader(daemon):
    r = run_fake_cuda_child(daemon, 6)     # every kernel: 3 inputs, 2 outputs, workspace
    print(json.dumps(r, indent=1)[:3000])
    assert r["device"] == "cuda" and r["target"] == "sm_90"
    assert r["partitions"] == 1 and r["views"] == 1      # h.t() comes back as an alias
    (k,) = r["kernels"]
    assert k["device_type"] == "cuda" and k["target"] == "cuda:sm_90"
    assert "extern" in k["kinds"] and "pointwise" in k["kinds"], k["kinds"]
    events = k["events"]
    launches = [e.split()[1] for e in events if e.startswith("launch ")]
    gemms = [e for e in events if e.startswith("cublas gemm")]
    # every generated kernel launched once, in the manifest's order, on our
    # stream; the GEMM step went to cuBLAS between them
    want = [n for n, kind in zip(k["names"], k["kinds"]) if kind != "extern"]
    assert [n.split("_")[0] for n in launches] == [n.split("_")[0] for n in want], (launches, want)
    assert len(gemms) == k["kinds"].count("extern"), events
    assert all("stream=0" not in e for e in events if e.startswith("launch ")), events
    params = ",".join(e.split(" p=")[1] for e in events if e.startswith("launch "))
    for ptr in k["inputs"] + k["outputs"]:
        assert ptr in params or any(ptr in g for g in gemms), (ptr, events)


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA), reason="fake libcuda not built")
def test_reduce_overhead_launches_as_cuda_graphs(daemon):
    """mode="reduce-overhead": each kernel's plan is captured once on the
    first launch with a set of pointers and replayed as one graph launch
    on the next with the same pointers (fake driver: what it records)."""
    r = run_fake_cuda_child(daemon, 6, TCC_CHILD_MODE="reduce-overhead")
    (k,) = r["kernels"]
    assert r["mode"] == "reduce-overhead" and k["graphs"] is True
    assert k["stats"] == {"direct_launches": 0, "graph_captures": 1, "graph_replays": 2}, k["stats"]
    ev = k["events"]
    # captured once (no launch runs outside the graph), then two replays of
    # every generated kernel, in the plan's order, with our pointers
    assert sum(e.startswith("capture ") for e in ev) == 1 and sum(e.startswith("instantiate ") for e in ev) == 1, ev
    assert not [e for e in ev if e.startswith("launch ")], ev
    replays = [i for i, e in enumerate(ev) if e.startswith("replay ")]
    assert len(replays) == 2, ev
    want = [n.split("_")[0] for n, kind in zip(k["names"], k["kinds"]) if kind != "extern"]
    first = ev[replays[0] + 1:replays[1]]
    got = [e.split()[0] for e in first if e.startswith("  ") and "cublas" not in e]
    assert [g.split("_")[0] for g in got] == want, (got, want)
    for ptr in k["inputs"] + k["outputs"]:
        assert any(ptr in e for e in first), (ptr, first)


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA), reason="fake libcuda not built")
def test_index_put_and_scatter_compile_for_cuda(daemon):
    """A StaticCache update (index_put, integer index) and a one-hot
    (scatter.value) compile for sm_90 in one partition (NVRTC) and launch
    through the loader (fake driver)."""
    r = run_fake_cuda_child(daemon, 8, TCC_CHILD_GRAPH="index")
    assert r["target"] == "sm_90" and r["partitions"] == 1, r
    (k,) = r["kernels"]
    assert k["device_type"] == "cuda" and k["target"] == "cuda:sm_90"
    launches = [e for e in k["events"] if e.startswith("launch ")]
    assert launches and len(launches) == len([x for x in k["kinds"] if x != "extern"]), k["events"]


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA), reason="fake libcuda not built")
def test_rows_written_into_an_input_compile_for_cuda(daemon):
    """index_put_ into a graph input (a KV cache's update written where
    it lies) compiles for sm_90 in the partition that reads the cache
    (NVRTC: the store guarded, the input's pointer written), its kernel
    launched first on the cache's own pointer."""
    r = run_fake_cuda_child(daemon, 6, TCC_CHILD_GRAPH="write")
    assert r["target"] == "sm_90" and r["partitions"] == 1, r
    (k,) = r["kernels"]
    launches = [e for e in k["events"] if e.startswith("launch ")]
    assert len(launches) == len(k["kinds"]) >= 2, k
    assert k["inputs"][0] in launches[0], (k["inputs"], launches)


@pytest.mark.skipif(not os.path.exists(FAKE_CUDA), reason="fake libcuda not built")
def test_convolution_is_a_cudnn_step_with_its_workspace(daemon):
    """A convolution compiles for sm_90 into a cuDNN step and its epilogue
    kernel; the package sizes the workspace as the loaded plan asks (the
    manifest's, then the 4096 bytes the fake cuDNN's algorithm needs) and
    the call runs on the package's pointers before the epilogue."""
    r = run_fake_cuda_child(daemon, 5, TCC_CHILD_GRAPH="conv")
    assert r["target"] == "sm_90" and r["partitions"] == 1, r
    (k,) = r["kernels"]
    assert k["kinds"] == ["extern", "pointwise"], k["kinds"]
    aligned = (k["manifest_workspace_bytes"] + 255) // 256 * 256
    assert k["workspace_bytes"] == aligned + 4096, k
    ev = k["events"]
    conv = [i for i, e in enumerate(ev) if e.startswith("cudnn fwd ")]
    launch = [i for i, e in enumerate(ev) if e.startswith("launch ")]
    assert len(conv) == 1 and len(launch) == 1 and conv[0] < launch[0], ev
    call = ev[conv[0]]
    assert f"x={k['inputs'][0]}" in call and f"w={k['inputs'][1]}" in call, call
    assert f"ws={int(k['workspace'], 16) + aligned:x} ws_bytes=4096" in call, call


CUDA = torch.cuda.is_available()


def _bench_models():
    from models import BENCH_MODELS
    return sorted(BENCH_MODELS)


@pytest.mark.skipif(not CUDA, reason="no CUDA device (CPU-only torch or no GPU)")
@pytest.mark.parametrize("name", _bench_models())
def test_training_steps_on_cuda_match_float64(daemon, fresh_state, name, monkeypatch):
    """Three training steps (forward, backward, SGD) of each model on CUDA
    tensors, compiled for the device (NVRTC cubins, cuBLAS steps), against
    the same model in float64 on the GPU. float32 math on the device in
    another order than the reference's: rtol 1e-3, atol 1e-4 on outputs
    and gradients, with TF32 off for convolutions as for matmuls
    (cudnn.allow_tf32 is on by default, and tccd follows it)."""
    from models import BENCH_MODELS

    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)

    make, data, loss_fn = BENCH_MODELS[name]
    torch.manual_seed(fresh_state)
    m = make().cuda().train()
    ref = copy.deepcopy(m).double()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05)
    cm = torch.compile(m, backend=tccd.backend(cuda="compile"))
    for step in range(3):
        x, t = data()
        x, t = x.cuda(), t.cuda()
        xr = x.double() if x.is_floating_point() else x
        out = cm(x)
        assert out.is_cuda
        ref_out = ref(xr)
        torch.testing.assert_close(out.double(), ref_out, rtol=1e-3, atol=1e-4,
                                   msg=lambda s: f"{name} step {step} output: {s}")
        opt.zero_grad()
        ref_opt.zero_grad()
        loss_fn(out, t).backward()
        t64 = t.double() if t.is_floating_point() else t
        loss_fn(ref_out, t64).backward()
        tol = dict(rtol=1e-3, atol=1e-4)
        for (n, p), q in zip(m.named_parameters(), ref.parameters()):
            assert p.grad is not None and p.grad.is_cuda, n
        grads = [p.grad for p in m.parameters()]
        if not all(torch.allclose(g.double(), q.grad, **tol)
                   for g, q in zip(grads, ref.parameters())):
            # an activation at a ReLU kink taken on the other side (kinks.py)
            ok, why = explain_by_relu_kinks(ref, lambda mm: loss_fn(mm(xr), t64), grads, tol)
            if not ok:
                for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                    torch.testing.assert_close(
                        p.grad.double(), q.grad, **tol,
                        msg=lambda s, n=n: f"{name} step {step} grad {n} ({why}): {s}")
            print(f"{name} step {step}: float64's gradients with {why}; the models diverge")
            break
        opt.step()
        ref_opt.step()
    s = tccd.stats()
    print(name, s)
    assert s["compiled_ops"] > 0 and s["eager_graphs"] == 0, s
    assert s["fallback_ops"] == 0, s


@pytest.mark.skipif(not CUDA, reason="no CUDA device (CPU-only torch or no GPU)")
def test_default_backend_compiles_cuda_graphs(daemon, fresh_state, monkeypatch):
    """backend="tccd" with no options and no TCCD_CUDA compiles graphs on
    CUDA tensors (the default cuda="compile"): no graph runs eagerly."""
    from models import MODELS

    monkeypatch.delenv("TCCD_CUDA", raising=False)
    make, data, loss_fn = MODELS["mlp"]
    m = make().cuda().train()
    ref = copy.deepcopy(m).double()
    cm = torch.compile(m, backend="tccd")
    x, t = data()
    x, t = x.cuda(), t.cuda()
    out = cm(x)
    ref_out = ref(x.double())
    torch.testing.assert_close(out.double(), ref_out, rtol=1e-3, atol=1e-4)
    loss_fn(out, t).backward()
    loss_fn(ref_out, t).backward()
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), q.grad, rtol=1e-3, atol=1e-4,
                                   msg=lambda s: f"grad {n}: {s}")
    s = tccd.stats()
    assert s["compiled_ops"] > 0 and s["eager_graphs"] == 0 and s["fallback_ops"] == 0, s
