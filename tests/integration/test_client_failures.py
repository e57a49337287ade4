"""
libtccclient (through tcctl) fails fast and says the right thing, against
the real daemon: a refused connection is UNAVAILABLE at once whatever the
connect timeout; a daemon killed or shut down during a compile is
UNAVAILABLE ("went away during the call"), soon after; a bad --addr or
$TCCD_ADDR is a usage error (exit 2); `tcctl fetch` with trusted keys
writes nothing whose signature does not verify, as `tcctl compile` does.
"""
import os
import signal
import subprocess
import threading
import time

import pytest

from conftest import GRAPHS, TCCTL, free_port, keygen, tcctl

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")


def test_refused_connection_is_unavailable_at_once():
    addr = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    p = tcctl(addr, "--connect-timeout-ms", "20000", "stats", check=False, json_out=False)
    dt = time.monotonic() - t0
    assert p.returncode == 1
    assert p.stderr.startswith(f"tcctl: stats: UNAVAILABLE: cannot reach tccd at {addr}: "), p.stderr
    assert "Connection refused" in p.stderr
    assert dt < 3.0, f"tcctl took {dt:.2f} s against a refused port (connect timeout 20 s)"


@pytest.mark.parametrize("addr, why", [
    ("127.0.0.1:99999", "port 99999 is out of range (1-65535)"),
    ("garbage", "the port is missing"),
    ("[::1:7311", "'[' without its ']'"),
])
def test_bad_address_is_a_usage_error(addr, why):
    p = tcctl(addr, "health", check=False, json_out=False)
    assert p.returncode == 2
    assert p.stderr.startswith(f"tcctl: --addr: tccd address '{addr}': {why}"), p.stderr
    env = dict(os.environ, TCCD_ADDR=addr)
    p = subprocess.run([TCCTL, "stats"], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 2
    assert p.stderr.startswith(f"tcctl: TCCD_ADDR: tccd address '{addr}': {why}"), p.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_daemon_gone_during_compile_is_unavailable(daemon_factory, tmp_path, sig):
    """tcctl compile while the daemon compiles (a C compiler that sleeps)
    and is killed, or shut down with a 200 ms grace: UNAVAILABLE naming
    the daemon, within seconds (the connect timeout is 20 s)."""
    pids = tmp_path / "cc-pids"
    cc = tmp_path / "slow-cc"
    cc.write_text('#!/bin/sh\ncase "$*" in *--version*) exec cc "$@";; esac\n'
                  f'echo $$ >> "{pids}"\nexec sleep 120\n')
    cc.chmod(0o755)
    d = daemon_factory(extra_args=["--cc", str(cc), "--shutdown-grace-ms", "200"]).start()
    gone = {}

    def kill_when_compiling():
        deadline = time.monotonic() + 120
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        gone["t"] = time.monotonic()
        d.proc.send_signal(sig)

    killer = threading.Thread(target=kill_when_compiling)
    killer.start()
    try:
        p = tcctl(d.addr, "--connect-timeout-ms", "20000", "compile", SIN_COS, check=False, json_out=False)
        ended = time.monotonic()
    finally:
        killer.join()
        for pid in (pids.read_text().split() if pids.exists() else []):
            try:
                os.kill(int(pid), signal.SIGKILL)   # the compile left running
            except ProcessLookupError:
                pass
        d.proc.wait(60)
    assert p.returncode == 1
    assert p.stderr.startswith(f"tcctl: compile: UNAVAILABLE: tccd at {d.addr} went away during the call: "), \
        p.stderr
    assert ended - gone["t"] < 5.0, f"tcctl ended {ended - gone['t']:.2f} s after the daemon went away"


def _fetch(addr, *args, trusted=None):
    env = dict(os.environ)
    env.pop("TCCD_TRUSTED_KEYS", None)
    if trusted:
        env["TCCD_TRUSTED_KEYS"] = trusted
    return subprocess.run([TCCTL, "--addr", addr, "fetch", *args], capture_output=True, timeout=120, env=env)


def test_fetch_refuses_an_artifact_an_untrusted_key_signed(daemon, signing_key, tmp_path):
    r = daemon.tcctl("compile", SIN_COS)
    other = keygen(tmp_path / "other.key") + ".pub"
    out = tmp_path / "a.so"
    for args in ([r["guard_hash"], str(out)], [r["guard_hash"][:12], str(out)],
                 ["--digest", r["artifact_sha256"], str(out)]):
        p = _fetch(daemon.addr, *args, trusted=other)
        assert p.returncode == 1, p.stderr
        assert p.stderr.startswith(b"tcctl: fetch: PERMISSION_DENIED: "), p.stderr
        assert not out.exists(), "nothing is written when the signature does not verify"
        assert not list(tmp_path.glob("a.so.tmp*"))
    p = _fetch(daemon.addr, r["guard_hash"], "-", trusted=other)
    assert p.returncode == 1 and p.stdout == b""
    # without trusted keys the digest is still checked and the file written
    p = _fetch(daemon.addr, r["guard_hash"], str(out))
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size == r["artifact_size"]


def test_fetch_writes_an_artifact_the_trusted_key_signed(daemon, signing_key, tmp_path):
    r = daemon.tcctl("compile", SIN_COS)
    out = tmp_path / "a.so"
    p = _fetch(daemon.addr, r["guard_hash"], str(out), trusted=signing_key + ".pub")
    assert p.returncode == 0, p.stderr
    assert out.stat().st_size == r["artifact_size"]
