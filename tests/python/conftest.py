"""
Fixtures for the Python package tests: the real tccd on a free loopback
port with a temporary cache, the real tcctl, and the `tccd` package bound
to this build's libtccclient.so (TCCD_CLIENT_LIB).

Paths come from meson (TCC_BUILD_DIR, TCC_SOURCE_DIR); run with
`meson test -C <build> --suite python` (or scripts/test). Every numerical
test draws fresh random inputs from a seed printed in its output.

Daemons sign their artifacts with a key made once per session (`tcctl
keygen`), and the package verifies them: TCCD_TRUSTED_KEYS names the
public key, as production would. They get --allow-root when the tests run
as root (CI containers do).
"""
import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
BUILD = os.path.abspath(os.environ.get("TCC_BUILD_DIR") or os.path.join(HERE, "../../build"))
SOURCE = os.path.abspath(os.environ.get("TCC_SOURCE_DIR") or os.path.join(HERE, "../.."))
TCCD = os.path.join(BUILD, "daemon", "tccd")
TCCTL = os.path.join(BUILD, "client", "tcctl")
CLIENT_LIB = os.path.join(BUILD, "client", "libtccclient.so")

# Bind the package to this build before anything imports it.
os.environ["TCCD_CLIENT_LIB"] = CLIENT_LIB
for var in ("TCCD_ADDR", "TCCD_FALLBACK", "TCCD_TRUSTED_KEYS", "TCCD_TOKEN", "TCCD_DEADLINE_MS", "TCCD_CONNECT_TIMEOUT_MS",
            "TCCD_OPS", "TCCD_ARTIFACT_DIR", "TCCD_CPU_ISA"):
    os.environ.pop(var, None)
# AOTAutograd's cache (tccd's aot_cache, Inductor's too) in a directory of
# this session's, so no entry of an earlier run is met; the children the
# tests start inherit it unless a test gives them their own.
os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tccd-tests-aot-")
# Plans (tccd/plan.py) off unless a test turns them on: with them, a test
# that clears its node's cache would start from another test's plan in the
# shared daemon instead of tracing what it means to test.
os.environ["TCCD_PLANS"] = "0"
atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)
sys.path.insert(0, HERE)
# Test this checkout's package source (scripts/setup also installs it
# editable into .venv, which registers the entry point).
sys.path.insert(0, os.path.join(SOURCE, "client", "python"))

import torch  # noqa: E402

import tccd  # noqa: E402


class Daemon:
    """One tccd process; start() waits for its port file."""

    def __init__(self, workdir, cache_dir=None, extra_args=(), port=0):
        self.listen_port = port
        self.signing_key = signing_key()
        self.workdir = str(workdir)
        self.cache_dir = cache_dir or os.path.join(self.workdir, "cache")
        self.extra_args = list(extra_args)
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.workdir, "tccd.log")

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def start(self, timeout=60):
        os.makedirs(self.workdir, exist_ok=True)
        port_file = os.path.join(self.workdir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        cmd = [TCCD, "--listen", f"127.0.0.1:{self.listen_port}", "--cache-dir", self.cache_dir,
               "--port-file", port_file, "--log-level", "debug",
               "--signing-key", self.signing_key] + self.extra_args
        if os.geteuid() == 0:
            cmd.append("--allow-root")
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(port_file):
                text = open(port_file).read().strip()
                if text:
                    self.port = int(text)
                    return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"tccd exited with {self.proc.returncode}:\n{self.read_log()}")
            time.sleep(0.02)
        raise RuntimeError(f"tccd did not start in {timeout}s:\n{self.read_log()}")

    def stop(self, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"tccd did not exit within {timeout}s:\n{self.read_log()}")
        self.log.close()
        return rc

    def read_log(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""

    def tcctl(self, *args):
        cmd = [TCCTL, "--addr", self.addr, "--json"] + list(args)
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if p.returncode != 0:
            raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
        return json.loads(p.stdout)

    def stats(self):
        return self.tcctl("stats")


_KEY = None


def signing_key():
    """The session's signing key (made on first use); its .pub is trusted."""
    global _KEY
    if _KEY is None:
        import tempfile

        d = tempfile.mkdtemp(prefix="tccd-keys-")
        path = os.path.join(d, "signing.key")
        p = subprocess.run([TCCTL, "keygen", path], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, f"tcctl keygen failed: {p.stderr}"
        os.environ["TCCD_TRUSTED_KEYS"] = path + ".pub"
        _KEY = path
    return _KEY


def _start(tmp, **kw):
    return Daemon(tmp, **kw).start()


@pytest.fixture(scope="session")
def shared_daemon(tmp_path_factory):
    """One daemon for the tests that only need a daemon (compiles are
    cached across tests, which keeps the suite fast)."""
    d = _start(tmp_path_factory.mktemp("tccd-shared"))
    yield d
    rc = d.stop()
    assert rc == 0, f"tccd exited {rc} on SIGTERM:\n{d.read_log()}"


@pytest.fixture
def daemon(shared_daemon, monkeypatch):
    """The shared daemon, as $TCCD_ADDR."""
    monkeypatch.setenv("TCCD_ADDR", shared_daemon.addr)
    return shared_daemon


@pytest.fixture
def own_daemon(tmp_path, monkeypatch):
    """A daemon of this test's own (fresh cache), as $TCCD_ADDR."""
    started = []

    def make(**kw):
        d = _start(tmp_path / f"tccd{len(started)}", **kw)
        started.append(d)
        monkeypatch.setenv("TCCD_ADDR", d.addr)
        return d

    yield make
    for d in started:
        if d.proc and d.proc.poll() is None:
            rc = d.stop()
            assert rc == 0, f"tccd exited {rc} on SIGTERM:\n{d.read_log()}"


@pytest.fixture(autouse=True)
def fresh_state():
    """Each test: Dynamo's caches reset, tccd's counters zeroed, a fresh seed."""
    torch._dynamo.reset()
    tccd.reset_stats()
    # TCC_TEST_SEED replays a failing run's seed (printed with each test)
    seed = int(os.environ.get("TCC_TEST_SEED") or time.time_ns() % (2**31))
    torch.manual_seed(seed)
    print(f"seed {seed}")
    yield seed
    torch._dynamo.reset()


def run_child(script, args, addr, aot_dir, env=None):
    """Runs tests/python/`script` with `args` in a fresh interpreter, on
    the daemon at `addr` with `aot_dir` as its TORCHINDUCTOR_CACHE_DIR (a
    node of its own) and `env` over this environment; returns the JSON its
    output ends with."""
    env = dict(os.environ, TCCD_ADDR=addr, TORCHINDUCTOR_CACHE_DIR=str(aot_dir),
               PYTHONPATH=os.pathsep.join([HERE, os.path.join(SOURCE, "client", "python")]),
               **(env or {}))
    p = subprocess.run([sys.executable, os.path.join(HERE, script)] + [str(a) for a in args],
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, f"{script} failed:\n{p.stdout}\n{p.stderr}"
    return json.loads(p.stdout.strip().splitlines()[-1])


def free_port():
    """A loopback port nothing listens on (bound and released)."""
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pytest_configure(config):
    # Captured logs shown with a failure: INFO and up (torch's DEBUG trace
    # records would bury the assertion).
    if not config.getoption("log_level", None):
        config.option.log_level = "INFO"
