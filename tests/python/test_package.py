"""The package itself: entry point, generated protobuf module, library
lookup, the ctypes client against the real daemon, options."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

import tccd
from conftest import CLIENT_LIB, SOURCE
from tccd import _lib
from tccd._proto import regen
from tccd._proto import tcc_pb2 as pb


def test_generated_proto_is_current():
    """tcc_pb2.py is what grpc_tools.protoc makes of proto/tcc/v1/tcc.proto now."""
    new = regen.generate(os.path.join(SOURCE, "proto"))
    with open(regen.CHECKED_IN, "rb") as f:
        old = f.read()
    assert old == new, ("client/python/tccd/_proto/tcc_pb2.py is stale: run "
                        "`.venv/bin/python -m tccd._proto.regen` (from client/python)")


def test_entry_point_registers_backend_without_import():
    """A fresh interpreter finds backend="tccd" through the
    torch_dynamo_backends entry point, never importing tccd itself."""
    code = textwrap.dedent("""
        import sys, torch, torch._dynamo
        from importlib.metadata import entry_points
        eps = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "tccd"]
        assert eps, "no torch_dynamo_backends entry point named tccd"
        print("value", eps[0].value)
        assert "tccd" in torch._dynamo.list_backends()
        assert "tccd" not in sys.modules
        from torch._dynamo.backends.registry import lookup_backend
        fn = lookup_backend("tccd")
        print("backend", fn.__module__, fn.__name__)
    """)
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       cwd="/", timeout=300)
    assert p.returncode == 0, (f"entry point check failed (is client/python installed? "
                               f"scripts/setup --test does it):\n{p.stdout}\n{p.stderr}")
    assert "value tccd.dynamo:tccd_backend" in p.stdout
    assert "backend tccd.dynamo tccd_backend" in p.stdout


def test_library_comes_from_env():
    assert os.path.samefile(_lib.path(), CLIENT_LIB)
    assert _lib.load().tcc_client_version().decode()


def test_library_missing_is_a_clear_error():
    code = "import tccd; tccd.Client('127.0.0.1:1')"
    env = dict(os.environ, TCCD_CLIENT_LIB="/nonexistent/libtccclient.so",
               PYTHONPATH=os.path.join(SOURCE, "client", "python"))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)
    assert p.returncode != 0
    assert "TccdLibraryError" in p.stderr
    assert "/nonexistent/libtccclient.so" in p.stderr
    assert "TCCD_CLIENT_LIB" in p.stderr


def _sin_cos_request(n=10):
    g = pb.Graph()
    meta = pb.TensorMeta(dtype=pb.FLOAT32, sizes=[n, n], strides=[n, 1],
                         device=pb.Device(type=pb.CPU))
    for name in ("x", "y", "s", "c", "out"):
        g.values.append(pb.TensorValue(name=name, meta=meta))
    g.inputs.extend(["x", "y"])
    g.outputs.append("out")
    ref = lambda v: pb.Argument(as_tensor=pb.TensorRef(name=v))  # noqa: E731
    g.nodes.append(pb.Node(target="aten.sin.default", inputs=[pb.NamedArgument(name="self", arg=ref("x"))], outputs=["s"]))
    g.nodes.append(pb.Node(target="aten.cos.default", inputs=[pb.NamedArgument(name="self", arg=ref("y"))], outputs=["c"]))
    g.nodes.append(pb.Node(target="aten.add.Tensor", inputs=[pb.NamedArgument(name="self", arg=ref("s")),
                                                             pb.NamedArgument(name="other", arg=ref("c"))], outputs=["out"]))
    return pb.CompileRequest(graph=g, target=pb.Target(device=pb.CPU), client="test_package")


def test_client_compile_load_run(daemon):
    """Client.get_kernel + Kernel.run on a hand-built graph: a miss, then a hit;
    outputs allocated from the manifest; float64 reference."""
    c = tccd.Client(daemon.addr)
    assert c.health() == 1
    req = _sin_cos_request()
    k, resp = c.get_kernel(req)
    assert resp.cache in (pb.MISS, pb.HIT)
    assert len(resp.guard_hash) == 64
    x, y = torch.randn(10, 10), torch.randn(10, 10)
    out, = k.run([x, y])
    ref = x.double().sin() + y.double().cos()
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-6)
    k2, resp2 = c.get_kernel(req)
    assert resp2.cache == pb.HIT and resp2.guard_hash == resp.guard_hash
    with pytest.raises(ValueError, match="strides"):
        k2.run([x.t(), y])
    st = c.stats()
    assert st.hits >= 1 and st.requests >= 2
    c.close()


def test_client_errors_name_status_and_address(daemon):
    c = tccd.Client(daemon.addr)
    req = _sin_cos_request()
    req.graph.nodes[0].target = "aten.frobnicate.default"
    with pytest.raises(tccd.TccdUnsupported) as e:
        c.compile(req)
    assert e.value.status == "UNIMPLEMENTED"
    assert daemon.addr in str(e.value) and "frobnicate" in str(e.value)
    req = _sin_cos_request()
    req.graph.values[4].meta.sizes[0] = 3
    with pytest.raises(tccd.TccdCompileError) as e:
        c.compile(req)
    assert e.value.status == "INVALID_ARGUMENT"


def test_ops_rpc(daemon):
    """Compiler.Ops: a daemon that has it lists the pointwise ops and float32."""
    c = tccd.Client(daemon.addr)
    try:
        ops = c.ops()
    except tccd.TccdUnsupported as e:
        pytest.skip(f"this tccd has no Compiler.Ops yet ({e.message}); the backend verifies "
                    "ops by trial compiles instead")
    targets = {o.target for o in ops.ops}
    assert {"aten.add.Tensor", "aten.sin.default", "aten.cos.default"} <= targets
    assert pb.FLOAT32 in ops.dtypes


def test_options_validated():
    with pytest.raises(ValueError, match="unknown mode"):
        tccd.backend(mode="fastest")
    with pytest.raises(ValueError, match="fallback"):
        tccd.backend(fallback="maybe")
    with pytest.raises(ValueError, match="unknown option"):
        tccd.Config.make(colour="blue")
    b = tccd.backend(mode="max-autotune", fallback="eager", deadline_ms=1234)
    assert b == tccd.backend(mode="max-autotune", fallback="eager", deadline_ms=1234)
    cfg = tccd.Config.make(**b.options)
    assert (cfg.mode, cfg.fallback, cfg.deadline_ms) == ("max-autotune", "eager", 1234)
    assert cfg.connect_timeout_ms == 1234


def test_env_defaults(monkeypatch):
    monkeypatch.setenv("TCCD_ADDR", "10.1.2.3:99")
    monkeypatch.setenv("TCCD_FALLBACK", "eager")
    monkeypatch.setenv("TCCD_DEADLINE_MS", "2500")
    cfg = tccd.Config.make()
    assert (cfg.addr, cfg.fallback, cfg.deadline_ms, cfg.connect_timeout_ms) == (
        "10.1.2.3:99", "eager", 2500, 2500)
    monkeypatch.setenv("TCCD_DEADLINE_MS", "soon")
    with pytest.raises(ValueError, match="TCCD_DEADLINE_MS"):
        tccd.Config.make()
    monkeypatch.delenv("TCCD_ADDR")
    monkeypatch.delenv("TCCD_DEADLINE_MS")
    assert tccd.Config.make().addr == "127.0.0.1:7311"


def test_max_autotune_waits_longer_by_default(monkeypatch):
    """A cold max-autotune compile takes minutes (a Llama decoder's first
    one passed the 60 s default and failed the job): its modes default to a
    10-minute deadline; an explicit option or TCCD_DEADLINE_MS still wins."""
    monkeypatch.delenv("TCCD_DEADLINE_MS", raising=False)
    assert tccd.Config.make().deadline_ms == 60000
    for mode in ("max-autotune", "max-autotune-no-cudagraphs"):
        assert tccd.Config.make(mode=mode).deadline_ms == 600000
        assert tccd.Config.make(mode=mode).connect_timeout_ms == 5000
        assert tccd.Config.make(mode=mode, deadline_ms=3000).deadline_ms == 3000
    monkeypatch.setenv("TCCD_DEADLINE_MS", "7000")
    assert tccd.Config.make(mode="max-autotune").deadline_ms == 7000


@pytest.mark.parametrize("name,warns", [("TCC_CHECK", False), ("TCCD_CHECK", True)])
def test_check_switch_and_its_old_name(name, warns):
    """TCC_CHECK=1 turns the eager comparison on; TCCD_CHECK, its name
    before the naming rule, still does until 0.2, with a FutureWarning."""
    code = "import tccd.dynamo as d; print('check', d._CHECK)"
    env = {k: v for k, v in os.environ.items() if k not in ("TCC_CHECK", "TCCD_CHECK")}
    env.update({name: "1", "PYTHONPATH": os.path.join(SOURCE, "client", "python")})
    p = subprocess.run([sys.executable, "-W", "always::FutureWarning", "-c", code],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "check True" in p.stdout
    assert ("TCCD_CHECK is deprecated" in p.stderr) == warns, p.stderr


def test_kernel_blas_runs_single_threaded(daemon):
    """Kernels' OpenBLAS is initialised with TCCD_KERNEL_THREADS (1) threads,
    and the environment is left as it was."""
    import ctypes

    assert "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ
    m = torch.nn.Linear(32, 32)
    x = torch.randn(8, 32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend="tccd")(x), m(x), rtol=1e-4, atol=1e-5)
    assert "OPENBLAS_NUM_THREADS" not in os.environ and "OMP_NUM_THREADS" not in os.environ
    try:
        blas = ctypes.CDLL("libopenblas.so.0", mode=os.RTLD_NOLOAD | os.RTLD_LAZY)
    except OSError:
        pytest.skip("no system OpenBLAS loaded (the daemon compiled no BLAS call)")
    assert blas.openblas_get_num_threads() == 1
