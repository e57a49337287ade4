"""The client fails fast and says the right thing: a refused connection is
TccdUnavailable at once (not after the connect timeout), so
fallback="eager" against a daemon that is not running costs about nothing
per graph; the down verdict is asked again soon, and a connected client
finds a daemon that comes back within about a second; a daemon that goes away
during a compile (killed, or shut down) is TccdUnavailable, never a
compile error; a bad address is a ValueError before anything is dialed."""
import os
import signal
import threading
import time
import warnings

import pytest
import torch

import tccd
import tccd.dynamo
from conftest import Daemon, free_port


def foo(x, y):
    return torch.sin(x) + torch.cos(y)


def four_breaks(x):
    """Five graphs: four graph breaks."""
    x = torch.sin(x) + 1
    torch._dynamo.graph_break()
    x = torch.cos(x) * 2
    torch._dynamo.graph_break()
    x = torch.tanh(x) - 1
    torch._dynamo.graph_break()
    x = torch.exp(x) / 3
    torch._dynamo.graph_break()
    return torch.relu(x) + x


def warm_up(x):
    return torch.sigmoid(x) * 2


def test_refused_connect_is_unavailable_at_once():
    addr = f"127.0.0.1:{free_port()}"
    with pytest.raises(tccd.TccdUnavailable):       # gRPC's start-up is not measured
        tccd.Client(addr, connect_timeout_ms=10000)
    t0 = time.monotonic()
    with pytest.raises(tccd.TccdUnavailable) as e:
        tccd.Client(addr, connect_timeout_ms=10000)
    dt = time.monotonic() - t0
    assert dt < 1.0, f"a refused connect took {dt:.2f} s (connect timeout 10 s)"
    msg = str(e.value)
    assert e.value.status == "UNAVAILABLE" and e.value.addr == addr and e.value.what == "connect"
    assert f"cannot reach tccd at {addr}" in msg and "Connection refused" in msg, msg


def test_eager_fallback_against_closed_port_is_cheap(monkeypatch):
    """torch.compile with fallback="eager" and the default 5 s connect
    timeout, against a port nothing listens on: five graphs cost no more
    than with backend="aot_eager" plus a little (it was 5 s per graph)."""
    monkeypatch.setenv("TCCD_ADDR", f"127.0.0.1:{free_port()}")
    monkeypatch.delenv("TCCD_CONNECT_TIMEOUT_MS", raising=False)
    x = torch.randn(8, 8)
    torch.compile(warm_up, backend="aot_eager")(x)    # Dynamo's and AOTAutograd's first-use costs

    def timed(backend):
        torch._dynamo.reset()
        t0 = time.perf_counter()
        out = torch.compile(four_breaks, backend=backend)(x)
        dt = time.perf_counter() - t0
        torch.testing.assert_close(out, four_breaks(x))
        return dt

    base = timed("aot_eager")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        t = timed(tccd.backend(fallback="eager"))
    fell_back = [x for x in w if issubclass(x.category, tccd.TccdFallbackWarning)]
    assert len(fell_back) == 5 and all("UNAVAILABLE" in str(x.message) for x in fell_back)
    s = tccd.stats()
    assert s["eager_graphs"] == 5 and s["compiled_ops"] == 0
    print(f"aot_eager {base:.3f} s, tccd (daemon down, fallback=eager) {t:.3f} s")
    assert t - base < 1.5, f"{t:.2f} s against {base:.2f} s with aot_eager"


def test_down_verdict_is_asked_again(tmp_path, monkeypatch):
    """fallback="eager": a failed connect is remembered (graphs meanwhile
    run eagerly at once) and asked again after DOWN_RECHECK_S, so a daemon
    that comes back is used."""
    port = free_port()
    monkeypatch.setenv("TCCD_ADDR", f"127.0.0.1:{port}")
    monkeypatch.setattr(tccd.dynamo, "DOWN_RECHECK_S", 3600.0)
    x, y = torch.randn(4, 4), torch.randn(4, 4)

    def compiled_ops(fn):
        torch._dynamo.reset()
        tccd.reset_stats()
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            torch.testing.assert_close(torch.compile(fn, backend=tccd.backend(fallback="eager"))(x, y),
                                       fn(x, y))
        return tccd.stats()["compiled_ops"], [str(m.message) for m in w]

    n, w = compiled_ops(foo)
    assert n == 0 and "Connection refused" in w[0]
    d = Daemon(tmp_path, port=port).start()
    try:
        n, w = compiled_ops(foo)            # remembered: not asked
        assert n == 0 and "asked again after 3600 s" in w[0], w
        monkeypatch.setattr(tccd.dynamo, "DOWN_RECHECK_S", 0.0)
        n, w = compiled_ops(foo)            # asked again: compiled
        assert n == 3 and not w, w
    finally:
        assert d.stop() == 0


def test_connected_client_finds_the_daemon_again(tmp_path):
    """A Client whose daemon stops: its calls are TccdUnavailable at once
    (connect timeout 10 s), and it uses the daemon again within about a
    second of its coming back on the same port."""
    port = free_port()
    d = Daemon(tmp_path / "a", port=port).start()
    c = tccd.Client(d.addr, connect_timeout_ms=10000)
    assert c.health() == 1
    assert d.stop() == 0
    for _ in range(2):
        t0 = time.monotonic()
        with pytest.raises(tccd.TccdUnavailable) as e:
            c.stats()
        assert time.monotonic() - t0 < 1.0, f"took {time.monotonic() - t0:.2f} s"
        assert f"tccd at {d.addr}" in str(e.value)
    d2 = Daemon(tmp_path / "b", port=port).start()
    try:
        up = time.monotonic()
        while True:
            try:
                c.stats()
                break
            except tccd.TccdUnavailable:
                assert time.monotonic() - up < 5.0, "the client did not find the daemon again"
                time.sleep(0.05)
        print(f"found again after {time.monotonic() - up:.2f} s")
    finally:
        c.close()
        assert d2.stop() == 0


def _slow_cc(tmp_path):
    """A C compiler that appends its pid to tmp_path/cc-pids, then sleeps
    (exec: the pid is the sleep's) -- a compile that runs until killed."""
    pids = tmp_path / "cc-pids"
    cc = tmp_path / "slow-cc"
    cc.write_text("#!/bin/sh\n"
                  'case "$*" in *--version*|*-dumpversion*) exec cc "$@";; esac\n'
                  f'echo $$ >> "{pids}"\n'
                  "exec sleep 120\n")
    cc.chmod(0o755)
    return str(cc), pids


def _kill_pids(pids):
    if pids.exists():
        for p in pids.read_text().split():
            try:
                os.kill(int(p), signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.mark.parametrize("how", ["SIGKILL", "SIGTERM"])
def test_daemon_gone_during_compile_is_unavailable(tmp_path, own_daemon, monkeypatch, how):
    """The daemon is killed (or shut down, grace 200 ms) while it compiles
    our graph: TccdUnavailable naming it, soon after (the retry finds the
    port refused and does not wait out the 10 s connect timeout)."""
    cc, pids = _slow_cc(tmp_path)
    d = own_daemon(extra_args=["--cc", cc, "--shutdown-grace-ms", "200"])
    monkeypatch.setenv("TCCD_CONNECT_TIMEOUT_MS", "10000")
    gone = {}

    def kill_when_compiling():
        deadline = time.monotonic() + 120
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        gone["t"] = time.monotonic()
        d.proc.send_signal(signal.SIGKILL if how == "SIGKILL" else signal.SIGTERM)

    killer = threading.Thread(target=kill_when_compiling)
    killer.start()
    try:
        with pytest.raises(tccd.TccdError) as e:
            torch.compile(foo, backend="tccd")(torch.randn(3), torch.randn(3))
        raised = time.monotonic()
    finally:
        killer.join()
        _kill_pids(pids)            # the compile the daemon left running (SIGTERM: it waits for it)
        d.proc.wait(60)
    assert type(e.value) is tccd.TccdUnavailable, f"{type(e.value).__name__}: {e.value}"
    msg = str(e.value)
    assert e.value.status == "UNAVAILABLE" and d.addr in msg, msg
    assert "CANCELLED" not in msg
    print(msg)
    assert raised - gone["t"] < 5.0, f"raised {raised - gone['t']:.2f} s after the daemon went away"


def test_bad_addresses_are_value_errors(monkeypatch):
    """libtccclient's address check, before anything is dialed: from
    options, from $TCCD_ADDR (named), and through tccd.Client."""
    with pytest.raises(ValueError, match=r"tccd: addr: tccd address '127\.0\.0\.1:99999': port 99999 is out "
                                         r"of range \(1-65535\)"):
        tccd.backend(addr="127.0.0.1:99999")
    with pytest.raises(ValueError, match="tccd address 'garbage': the port is missing"):
        tccd.backend(addr="garbage", fallback="eager")     # a usage error, not a fallback
    with pytest.raises(ValueError, match="IPv6 address goes in brackets"):
        tccd.Config.make(addr="::1:7311")
    with pytest.raises(ValueError, match="must be a string"):
        tccd.Config.make(addr=7311)
    monkeypatch.setenv("TCCD_ADDR", "localhost:0")
    with pytest.raises(ValueError, match="tccd: TCCD_ADDR: tccd address 'localhost:0': port 0 is out of range"):
        tccd.Config.make()
    monkeypatch.delenv("TCCD_ADDR")
    for good in ("localhost:7311", "[::1]:7311", "unix:/run/tccd.sock", "dns:///tccd.svc:7311"):
        assert tccd.Config.make(addr=good).addr == good
    with pytest.raises(tccd.TccdError) as e:
        tccd.Client("127.0.0.1:99999")
    assert e.value.status == "INVALID_ARGUMENT" and "port 99999 is out of range" in str(e.value)
