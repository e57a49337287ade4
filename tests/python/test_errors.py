"""Daemon unreachable, silent, slow or failing: a clear TccdError naming
address and status, never a hang; or, when configured, a warning and the
right answer from eager execution."""
import os
import socket
import stat
import threading
import time
import warnings

import pytest
import torch

import tccd
from conftest import Daemon, free_port


def foo(x, y):
    return torch.sin(x) + torch.cos(y)


def ref(x, y):
    return foo(x.double(), y.double())


F64 = dict(rtol=1e-5, atol=1e-6)


def test_daemon_down_raises_clear_error(monkeypatch):
    addr = f"127.0.0.1:{free_port()}"
    monkeypatch.setenv("TCCD_ADDR", addr)
    monkeypatch.setenv("TCCD_CONNECT_TIMEOUT_MS", "500")
    opt = torch.compile(foo, backend="tccd")
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    t0 = time.monotonic()
    with pytest.raises(tccd.TccdUnavailable) as e:
        opt(x, y)
    assert time.monotonic() - t0 < 20
    msg = str(e.value)
    assert addr in msg and "UNAVAILABLE" in msg, msg
    assert e.value.status == "UNAVAILABLE" and e.value.addr == addr
    assert isinstance(e.value, tccd.TccdError)


def test_daemon_down_then_up_recovers(tmp_path, monkeypatch):
    port = free_port()
    monkeypatch.setenv("TCCD_ADDR", f"127.0.0.1:{port}")
    monkeypatch.setenv("TCCD_CONNECT_TIMEOUT_MS", "500")
    opt = torch.compile(foo, backend="tccd")
    x, y = torch.randn(4, 4), torch.randn(4, 4)
    with pytest.raises(tccd.TccdUnavailable):
        opt(x, y)
    d = Daemon(tmp_path, port=port).start()
    try:
        torch.testing.assert_close(opt(x, y).double(), ref(x, y), **F64)   # the same compiled fn
        assert tccd.stats()["fallback_ops"] == 0
    finally:
        assert d.stop() == 0


@pytest.mark.parametrize("how", ["backend", "env", "options"])
def test_daemon_down_eager_fallback_warns(monkeypatch, how):
    monkeypatch.setenv("TCCD_ADDR", f"127.0.0.1:{free_port()}")
    monkeypatch.setenv("TCCD_CONNECT_TIMEOUT_MS", "300")
    if how == "backend":
        opt = torch.compile(foo, backend=tccd.backend(fallback="eager"))
    elif how == "env":
        monkeypatch.setenv("TCCD_FALLBACK", "eager")
        opt = torch.compile(foo, backend="tccd")
    else:
        opt = torch.compile(foo, backend="tccd", options={"fallback": "eager"})
    x, y = torch.randn(5, 5), torch.randn(5, 5)
    with pytest.warns(tccd.TccdFallbackWarning, match="UNAVAILABLE.*runs eagerly"):
        out = opt(x, y)
    torch.testing.assert_close(out.double(), ref(x, y), **F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")            # once per graph, not per call
        x, y = torch.randn(5, 5), torch.randn(5, 5)
        torch.testing.assert_close(opt(x, y).double(), ref(x, y), **F64)
    s = tccd.stats()
    assert s["eager_graphs"] == 1 and s["fallback_ops"] == 3 and s["compiled_ops"] == 0


def test_silent_server_times_out(monkeypatch):
    """Something listens but never speaks gRPC: the connect timeout ends it."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    conns = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conns.append(srv.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        monkeypatch.setenv("TCCD_ADDR", f"127.0.0.1:{srv.getsockname()[1]}")
        monkeypatch.setenv("TCCD_CONNECT_TIMEOUT_MS", "1000")
        opt = torch.compile(foo, backend="tccd")
        t0 = time.monotonic()
        with pytest.raises((tccd.TccdUnavailable, tccd.TccdDeadlineExceeded)):
            opt(torch.randn(3), torch.randn(3))
        assert time.monotonic() - t0 < 20
    finally:
        stop.set()
        t.join()
        for c in conns:
            c.close()
        srv.close()


def _fake_cc(tmp_path, body):
    """A C compiler that answers --version like cc and does `body` otherwise."""
    p = tmp_path / "fake-cc"
    p.write_text("#!/bin/sh\n"
                 'case "$1" in --version|-v|-dumpversion) exec cc "$@";; esac\n'
                 + body + "\n")
    p.chmod(p.stat().st_mode | stat.S_IXUSR)
    return str(p)


def test_compile_deadline(tmp_path, own_daemon, monkeypatch):
    cc = _fake_cc(tmp_path, "sleep 20; exec cc \"$@\"")
    own_daemon(extra_args=["--cc", cc, "--compile-timeout-ms", "30000"])
    monkeypatch.setenv("TCCD_DEADLINE_MS", "1500")
    opt = torch.compile(foo, backend="tccd")
    t0 = time.monotonic()
    with pytest.raises(tccd.TccdDeadlineExceeded) as e:
        opt(torch.randn(3), torch.randn(3))
    assert time.monotonic() - t0 < 15
    assert "DEADLINE_EXCEEDED" in str(e.value)


def test_compile_failure_raises_or_falls_back(tmp_path, own_daemon, monkeypatch):
    cc = _fake_cc(tmp_path, "echo 'fake-cc: internal compiler error: on purpose' >&2; exit 1")
    d = own_daemon(extra_args=["--cc", cc])
    x, y = torch.randn(6, 6), torch.randn(6, 6)
    with pytest.raises(tccd.TccdCompileError) as e:
        torch.compile(foo, backend="tccd")(x, y)
    assert d.addr in str(e.value)
    print(e.value)
    torch._dynamo.reset()
    with pytest.warns(tccd.TccdFallbackWarning):
        out = torch.compile(foo, backend=tccd.backend(fallback="eager"))(x, y)
    torch.testing.assert_close(out.double(), ref(x, y), **F64)


def test_daemon_error_carries_request_id(tmp_path):
    """A daemon's refusal raised in the package names the request id the
    daemon gave the call, and the daemon's log lines about it carry it."""
    from tccd._proto import tcc_pb2 as pb
    from tccd.client import Client

    d = Daemon(tmp_path).start()
    try:
        with Client(d.addr) as c:
            with pytest.raises(tccd.TccdError) as e:
                c.compile(pb.CompileRequest(client="test_errors"))   # no graph
        rid = e.value.request_id
        assert e.value.status == "INVALID_ARGUMENT" and rid, str(e.value)
        assert str(e.value).endswith(f"(request id {rid})"), str(e.value)
        lines = [ln for ln in d.read_log().splitlines() if f"request_id={rid}" in ln]
        assert lines and all(e.value.message in ln for ln in lines), d.read_log()
    finally:
        assert d.stop() == 0
