"""
Start-up and shutdown: clear refusals (port taken, unusable cache dir, bad
flags), flags from the environment, clean exit 0 on SIGINT and SIGTERM with
in-flight calls finished.
"""
import os
import signal
import socket
import subprocess
import threading
import time

import pytest

from conftest import GRAPHS, TCCD, Daemon, tcctl

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")


ROOT_ARGS = ["--allow-root"] if os.geteuid() == 0 else []


def run_tccd(*args, env=None, timeout=30, security=True):
    """tccd with args; security adds --no-signing (and --allow-root as root)."""
    extra = ROOT_ARGS + ["--no-signing"] if security else []
    return subprocess.run([TCCD, *extra, *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **(env or {})))


def test_refuses_a_port_in_use(daemon, tmp_path):
    p = run_tccd("--listen", daemon.addr, "--cache-dir", str(tmp_path / "other"))
    assert p.returncode != 0
    assert f"cannot listen on {daemon.addr}" in p.stderr
    assert "in use" in p.stderr
    # the first daemon is unharmed
    assert tcctl(daemon.addr, "health", json_out=False, check=False).returncode == 0


def test_refuses_a_port_held_by_another_program(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    port = s.getsockname()[1]
    try:
        p = run_tccd("--listen", f"127.0.0.1:{port}", "--cache-dir", str(tmp_path / "c"))
        assert p.returncode != 0 and "in use" in p.stderr
    finally:
        s.close()


def test_refuses_an_unusable_cache_dir(tmp_path):
    f = tmp_path / "file"
    f.write_text("not a directory")
    p = run_tccd("--listen", "127.0.0.1:0", "--cache-dir", str(f / "cache"))
    assert p.returncode != 0
    assert "cache" in p.stderr and str(f) in p.stderr

    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "cache.db").write_bytes(os.urandom(8192))
    p = run_tccd("--listen", "127.0.0.1:0", "--cache-dir", str(garbage))
    assert p.returncode != 0 and "cache" in p.stderr


def test_bad_flags_exit_2_with_a_message():
    p = run_tccd("--no-such-flag")
    assert p.returncode == 2 and "--no-such-flag" in p.stderr
    p = run_tccd("--workers", "many")
    assert p.returncode == 2 and "workers" in p.stderr
    p = run_tccd("--cache-max-bytes", "lots")
    assert p.returncode == 2 and "cache-max-bytes" in p.stderr
    p = run_tccd("--help")
    assert p.returncode == 0 and "--listen" in p.stdout and "TCCD_" in p.stdout


def test_flags_from_environment(tmp_path):
    port_file = tmp_path / "port"
    env = {"TCCD_LISTEN": "127.0.0.1:0", "TCCD_CACHE_DIR": str(tmp_path / "envcache"),
           "TCCD_PORT_FILE": str(port_file), "TCCD_WORKERS": "3", "TCCD_NO_SIGNING": "1"}
    if os.geteuid() == 0:
        env["TCCD_ALLOW_ROOT"] = "1"
    proc = subprocess.Popen([TCCD], env=dict(os.environ, **env), stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 30
        while not port_file.exists() and time.time() < deadline:
            time.sleep(0.02)
        addr = f"127.0.0.1:{int(port_file.read_text())}"
        s = tcctl(addr, "stats")
        assert s["workers"] == 3
        assert (tmp_path / "envcache" / "cache.db").exists()
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_clean_shutdown_on_signal(daemon_factory, sig):
    d = daemon_factory().start()
    d.tcctl("compile", SIN_COS)
    assert d.stop(sig) == 0
    log = d.read_log()
    assert "shutting down" in log and "stopped" in log


def test_shutdown_finishes_in_flight_compile(daemon_factory, tmp_path):
    slow = tmp_path / "slow-cc"
    slow.write_text('#!/bin/sh\ncase "$*" in *--version*) exec cc "$@";; esac\nsleep 1\nexec cc "$@"\n')
    slow.chmod(0o755)
    d = daemon_factory(extra_args=["--cc", str(slow)]).start()
    result = {}

    def compile_it():
        result["r"] = tcctl(d.addr, "compile", SIN_COS, check=False)

    t = threading.Thread(target=compile_it)
    t.start()
    time.sleep(0.4)  # the compile is running
    d.proc.send_signal(signal.SIGTERM)
    t.join(60)
    assert d.proc.wait(60) == 0
    r = result["r"]
    assert r.returncode == 0, r.stderr  # finished within the grace period
    # and it was stored before exit
    d.start()
    import json
    again = d.tcctl("compile", SIN_COS)
    assert again["cache"] == "hit"
    assert d.stop() == 0


def test_default_signing_key_is_made_once(tmp_path):
    """Without --signing-key or --no-signing the daemon signs with its own
    key, CACHE_DIR/signing.key, generated on first start and reused."""
    cache = tmp_path / "c"
    env = {"TCCD_NO_SIGNING": "", "TCCD_SIGNING_KEY": ""}
    port_file = tmp_path / "port"

    def start_and_stop():
        proc = subprocess.Popen([TCCD, *ROOT_ARGS, "--listen", "127.0.0.1:0", "--cache-dir", str(cache),
                                 "--port-file", str(port_file)], stderr=subprocess.PIPE, text=True,
                                env=dict(os.environ, **env))
        deadline = time.time() + 30
        while not port_file.exists() and time.time() < deadline and proc.poll() is None:
            time.sleep(0.02)
        stats = tcctl(f"127.0.0.1:{int(port_file.read_text())}", "stats")
        port_file.unlink()
        proc.send_signal(signal.SIGTERM)
        _, log = proc.communicate(timeout=30)
        assert proc.returncode == 0, log
        return stats, log

    stats, log = start_and_stop()
    key = cache / "signing.key"
    assert "generated the signing key" in log and str(key) in log
    assert key.stat().st_mode & 0o077 == 0, "the secret key is private"
    assert (cache / "signing.key.pub").read_text().startswith("tccd-ed25519-public ")
    assert stats["signing_key_id"] and stats["signing_key_id"] in (cache / "signing.key.pub").read_text()
    first = key.read_bytes()
    stats2, log2 = start_and_stop()
    assert "generated" not in log2 and key.read_bytes() == first
    assert stats2["signing_key_id"] == stats["signing_key_id"]


def test_signing_flags(tmp_path, signing_key):
    base = ["--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "c")]
    p = run_tccd(*ROOT_ARGS, *base, "--signing-key", signing_key, "--no-signing", security=False)
    assert p.returncode == 2 and "contradict" in p.stderr
    # a secret key file others may read is refused, naming it
    loose = tmp_path / "loose.key"
    loose.write_bytes(open(signing_key, "rb").read())
    loose.chmod(0o644)
    p = run_tccd(*ROOT_ARGS, *base, "--signing-key", str(loose), security=False)
    assert p.returncode != 0 and "loose.key" in p.stderr and "chmod 600" in p.stderr
    bad = tmp_path / "bad.key"
    bad.write_text("not a key\n")
    bad.chmod(0o600)
    p = run_tccd(*ROOT_ARGS, *base, "--signing-key", str(bad), security=False)
    assert p.returncode != 0 and "not a tccd secret key" in p.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to check the root refusal")
def test_refuses_root_without_allow_root(tmp_path, signing_key):
    p = run_tccd("--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "c"),
                 "--signing-key", signing_key, security=False, env={"TCCD_ALLOW_ROOT": ""})
    assert p.returncode != 0
    assert "refusing to run as root" in p.stderr and "--allow-root" in p.stderr
    assert not (tmp_path / "c").exists(), "nothing is touched before the refusal"
