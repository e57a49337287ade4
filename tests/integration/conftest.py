"""
Fixtures for the integration tests: the real tccd binary on a free
loopback port with a temporary cache directory, the real tcctl, and Python
protobuf modules generated from proto/ (grpcio-tools) for an independent
client.

Paths come from meson (TCC_BUILD_DIR, TCC_SOURCE_DIR); run the tests with
`meson test -C build --suite integration` or scripts/test.

Every daemon signs with a key made once per session by `tcctl keygen`
(Daemon(signing_key=None) runs it with --no-signing instead), and gets
--allow-root when the tests run as root (CI containers do).
"""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

BUILD = os.environ.get("TCC_BUILD_DIR") or os.path.join(os.path.dirname(__file__), "../../build")
SOURCE = os.environ.get("TCC_SOURCE_DIR") or os.path.join(os.path.dirname(__file__), "../..")
TCCD = os.path.join(BUILD, "daemon", "tccd")
TCCTL = os.path.join(BUILD, "client", "tcctl")
TCC_RUN = os.path.join(BUILD, "tests", "integration", "tcc-run")
GRAPHS = os.path.join(SOURCE, "tests", "graphs")


class Daemon:
    """One tccd process. start() waits until it listens; stop() signals it
    and returns its exit code; the log is kept in self.log_path."""

    def __init__(self, cache_dir, extra_args=(), wrapper=(), env=None, workdir=None,
                 signing_key=None):
        self.cache_dir = cache_dir
        self.signing_key = signing_key
        self.extra_args = list(extra_args)
        self.wrapper = list(wrapper)
        self.env = dict(os.environ, **(env or {}))
        self.workdir = workdir or tempfile.mkdtemp(prefix="tccd-run-")
        self.proc = None
        self.port = None
        self.log_path = os.path.join(self.workdir, "tccd.log")
        self.listen_port = 0

    @property
    def addr(self):
        return f"127.0.0.1:{self.port}"

    def start(self, timeout=60):
        port_file = os.path.join(self.workdir, "port")
        if os.path.exists(port_file):
            os.unlink(port_file)
        cmd = self.wrapper + [TCCD, "--listen", f"127.0.0.1:{self.listen_port}",
                              "--cache-dir", self.cache_dir, "--port-file", port_file,
                              "--log-level", "debug"] + self.security_args() + self.extra_args
        self.log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.time() + timeout
        while time.time() < deadline:
            if os.path.exists(port_file):
                self.port = int(open(port_file).read())
                self.listen_port = self.port  # a restart reuses the port
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"tccd exited with {self.proc.returncode}:\n{self.read_log()}")
            time.sleep(0.02)
        raise RuntimeError(f"tccd did not start in {timeout}s:\n{self.read_log()}")

    def security_args(self):
        args = ["--allow-root"] if os.geteuid() == 0 else []
        if self.signing_key:
            args += ["--signing-key", self.signing_key]
        else:
            args += ["--no-signing"]
        return args

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
        self.proc.send_signal(sig)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
            raise AssertionError(f"tccd did not exit within {timeout}s of {sig!r}:\n{self.read_log()}")
        self.log.close()
        return rc

    def kill9(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()

    def read_log(self):
        try:
            return open(self.log_path, errors="replace").read()
        except OSError:
            return ""

    def tcctl(self, *args, json_out=True, check=True, input=None, timeout=120):
        return tcctl(self.addr, *args, json_out=json_out, check=check, input=input, timeout=timeout)

    def stats(self):
        return self.tcctl("stats")


def tcctl(addr, *args, json_out=True, check=True, input=None, timeout=120):
    cmd = [TCCTL, "--addr", addr] + (["--json"] if json_out else []) + list(args)
    p = subprocess.run(cmd, capture_output=True, text=True, input=input, timeout=timeout)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {p.returncode}:\n{p.stderr}")
    if not check:
        return p
    return json.loads(p.stdout) if json_out else p.stdout


@pytest.fixture
def cache_dir(tmp_path):
    d = tmp_path / "cache"
    return str(d)


def keygen(path):
    """A signing key pair: path (secret) and path.pub, made by tcctl keygen."""
    p = subprocess.run([TCCTL, "keygen", str(path)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return str(path)


@pytest.fixture(scope="session")
def signing_key(tmp_path_factory):
    return keygen(tmp_path_factory.mktemp("keys") / "signing.key")


_DEFAULT = object()


@pytest.fixture
def daemon_factory(tmp_path, signing_key):
    started = []

    def make(cache_dir=None, signing_key=_DEFAULT, **kw):
        key = signing_key_default if signing_key is _DEFAULT else signing_key
        kw.setdefault("workdir", str(tmp_path))  # several daemons: give each its own (its log)
        d = Daemon(cache_dir or str(tmp_path / "cache"), signing_key=key, **kw)
        started.append(d)
        return d

    signing_key_default = signing_key
    yield make
    for d in started:
        if d.proc and d.proc.poll() is None:
            d.proc.kill()
            d.proc.wait()


@pytest.fixture
def daemon(daemon_factory):
    d = daemon_factory().start()
    yield d
    rc = d.stop()
    assert rc == 0, f"tccd exited {rc} on SIGTERM:\n{d.read_log()}"


@pytest.fixture(scope="session")
def pb(tmp_path_factory):
    """The tcc.v1 Python module, generated from proto/ by grpcio-tools.
    (grpc.health.v1 is not generated: its package name would shadow grpcio;
    the health test spells its two tiny messages out by hand.)"""
    from grpc_tools import protoc

    out = str(tmp_path_factory.mktemp("pb"))
    proto_dir = os.path.join(SOURCE, "proto")
    f = "tcc/v1/tcc.proto"
    rc = protoc.main(["protoc", f"-I{proto_dir}", f"--python_out={out}", os.path.join(proto_dir, f)])
    assert rc == 0, f"protoc failed on {f}"
    sys.path.insert(0, out)
    import importlib

    return importlib.import_module("tcc.v1.tcc_pb2")


def load_request_json(name):
    with open(os.path.join(GRAPHS, name)) as f:
        return json.load(f)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Redis:
    """A redis-server on 127.0.0.1:<port>, and a tiny RESP client. With
    cluster_bus, it listens on a bus port of its own too (bus_port)."""

    START_ATTEMPTS = 3

    def __init__(self, workdir, args=(), cluster_bus=False):
        self.dir = workdir
        self.port = free_port()
        self.bus_port = free_port() if cluster_bus else None
        self.args = list(args)
        self.proc = None

    def start(self):
        """Starts the server and waits for PONG. A free port can be taken
        between free_port() and redis-server's bind (tests run in
        parallel): when the server exits early, it tries fresh ports."""
        for attempt in range(self.START_ATTEMPTS):
            if attempt:
                self.port = free_port()
                if self.bus_port is not None:
                    self.bus_port = free_port()
            if self._start_once():
                return self
        raise RuntimeError(f"redis-server did not start (see {self.dir}/redis.log)")

    def _start_once(self):
        bus = ["--cluster-port", str(self.bus_port)] if self.bus_port is not None else []
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, *self.args, *bus],
            stdout=open(os.path.join(self.dir, "redis.log"), "ab"), stderr=subprocess.STDOUT)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                if self.cmd("PING") == "PONG":
                    return True
            except OSError:
                if self.proc.poll() is not None:     # it exited: the port was taken
                    return False
                time.sleep(0.05)
            except RuntimeError as e:  # --requirepass: it answers, so it is up
                if "NOAUTH" in str(e):
                    return True
                self.kill()
                raise
        self.kill()
        return False

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(20)

    @property
    def url(self):
        return f"redis://127.0.0.1:{self.port}"

    def cmd(self, *args, password=None):
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as s:
            f = s.makefile("rb")
            if password:
                s.sendall(self._encode(["AUTH", password]))
                self._read(f)
            s.sendall(self._encode(args))
            return self._read(f)

    @staticmethod
    def _encode(args):
        out = [b"*%d\r\n" % len(args)]
        for a in args:
            b = a if isinstance(a, bytes) else str(a).encode()
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)

    def _read(self, f):
        line = f.readline()
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            raise RuntimeError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            if n < 0:
                return None
            data = f.read(n + 2)
            return data[:-2]
        if kind == b"*":
            n = int(rest)
            return None if n < 0 else [self._read(f) for _ in range(n)]
        raise RuntimeError(f"bad RESP line {line!r}")


class RedisCluster:
    """A Redis Cluster of `masters` redis-server processes on free loopback
    ports (cluster-enabled, no persistence), the slots split evenly with
    CLUSTER ADDSLOTSRANGE and joined with CLUSTER MEET (no redis-cli
    needed); with `replicas`, that many more per master, attached with
    CLUSTER REPLICATE (self.replicas[m] are master m's). stop() ends every
    process."""

    def __init__(self, workdir, masters=3, replicas=0, node_timeout=2000):
        self.dir = workdir
        self.nodes = []
        total = masters * (1 + replicas)
        servers = []
        for i in range(total):
            d = os.path.join(workdir, f"node{i}")
            os.makedirs(d, exist_ok=True)
            # a bus port of its own each (port + 10000 may not exist)
            servers.append(Redis(d, cluster_bus=True,
                                 args=["--cluster-enabled", "yes", "--cluster-config-file",
                                       os.path.join(d, "nodes.conf"), "--cluster-node-timeout",
                                       str(node_timeout)]))
        self.nodes = servers[:masters]
        self.replicas = [servers[masters + m * replicas:masters + (m + 1) * replicas] for m in range(masters)]
        self.all = servers

    def start(self):
        try:
            for n in self.all:
                n.start()
            per = 16384 // len(self.nodes)
            for i, n in enumerate(self.nodes):
                lo, hi = i * per, (16383 if i == len(self.nodes) - 1 else (i + 1) * per - 1)
                n.cmd("CLUSTER", "ADDSLOTSRANGE", lo, hi)
            for n in self.all[1:]:
                n.cmd("CLUSTER", "MEET", "127.0.0.1", self.nodes[0].port, self.nodes[0].bus_port)
            deadline = time.time() + 30
            for m, reps in zip(self.nodes, self.replicas):
                mid = self.node_id(m)
                for r in reps:  # a replica can follow a master once it knows it
                    while mid.encode() not in r.cmd("CLUSTER", "NODES"):
                        if time.time() > deadline:
                            raise RuntimeError("a replica did not learn of its master")
                        time.sleep(0.05)
                    r.cmd("CLUSTER", "REPLICATE", mid)
            want = min(len(r) for r in self.replicas)
            while time.time() < deadline:
                if all(b"cluster_state:ok" in n.cmd("CLUSTER", "INFO") and
                       len(slots := n.cmd("CLUSTER", "SLOTS")) == len(self.nodes) and
                       all(len(e) >= 3 + want for e in slots) for n in self.all):
                    return self
                time.sleep(0.1)
            raise RuntimeError("the redis cluster did not become ok")
        except Exception:
            self.stop()
            raise

    def stop(self):
        for n in self.all:
            n.stop()

    def node_id(self, n):
        return n.cmd("CLUSTER", "MYID").decode()

    def owner(self, key):
        """The node that owns key's slot (asking a node that is up)."""
        live = [x for x in self.all if x.proc.poll() is None]
        slot = live[0].cmd("CLUSTER", "KEYSLOT", key)
        for lo, hi, master, *_ in live[0].cmd("CLUSTER", "SLOTS"):
            if lo <= slot <= hi:
                return next(x for x in self.all if x.port == master[1])
        raise AssertionError(f"no owner for slot {slot}")

    def url(self, *nodes):
        return ",".join(f"redis://127.0.0.1:{n.port}" for n in (nodes or self.nodes))

    def keys(self, n, pattern="tccd:*"):
        return {k.decode() for k in n.cmd("KEYS", pattern)}


# ------------------------------------------------ helpers shared by tests

def sin_cos_request(pb, rows):
    """The seed graph with `rows` rows (a new guard hash per value), as a
    tcc.v1.CompileRequest message."""
    from google.protobuf import json_format
    req = load_request_json("sin_cos.json")
    for v in req["graph"]["values"]:
        v["meta"]["sizes"] = [rows, 10]
    return json_format.ParseDict(req, pb.CompileRequest())


def sin_cos_variant(pb, rows):
    """sin_cos_request, encoded."""
    return sin_cos_request(pb, rows).SerializeToString()


def compile_on(d, payload, pb, timeout=120):
    """One raw Compile call to daemon d; the decoded CompileResponse."""
    import grpc
    with grpc.insecure_channel(d.addr) as ch:
        raw = ch.unary_unary("/tcc.v1.Compiler/Compile", request_serializer=None,
                             response_deserializer=None)(payload, timeout=timeout)
    return pb.CompileResponse.FromString(raw)


def fake_cc(tmp_path, name, body):
    """A C compiler wrapper at tmp_path/name: answers --version like cc (so
    the compiler identity, and the guard hashes, stay those of cc), else
    runs the shell `body`."""
    p = tmp_path / name
    p.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec cc "$@";; esac\n{body}\n')
    p.chmod(0o755)
    return str(p)


def wait_for(pred, timeout=20, what="condition"):
    """Polls pred() every 50 ms; AssertionError after timeout seconds."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")
