"""
Bearer-token auth (--auth-tokens): a call without a valid token is
UNAUTHENTICATED, a client token may compile, fetch and read the cache but
not Evict, Gc, ZeroStats, Clear or Warm (PERMISSION_DENIED; PutPlan and GetPlan
are client calls, PutPlan an admin one with --plan-writers admin), an admin
token may do everything;
Health/Check stays open for probes. Tokens never appear in the log.
"""
import os
import secrets
import subprocess
import time

import grpc
import pytest

from conftest import GRAPHS, TCC_RUN, TCCD, tcctl

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")
COMPILE = "/tcc.v1.Compiler/Compile"
HEALTH = "/grpc.health.v1.Health/Check"


@pytest.fixture
def tokens(tmp_path):
    t = {"client": secrets.token_hex(24), "admin": secrets.token_hex(24)}
    path = tmp_path / "tokens"
    path.write_text(f"# role token\nclient {t['client']}\n\nadmin  {t['admin']}\n")
    path.chmod(0o600)
    files = {}
    for role, tok in t.items():
        f = tmp_path / f"{role}.token"
        f.write_text(tok + "\n")
        files[role] = str(f)
    return {"file": str(path), "tokens": t, "files": files}


def call(addr, method, payload=b"", token=None, scheme="Bearer"):
    md = [("authorization", f"{scheme} {token}")] if token else None
    with grpc.insecure_channel(addr) as ch:
        return ch.unary_unary(method, request_serializer=None, response_deserializer=None)(
            payload, timeout=60, metadata=md)


def expect_fail(p, status):
    assert p.returncode == 1, p.stdout
    assert f": {status}: " in p.stderr, p.stderr


def test_roles(daemon_factory, tokens, tmp_path, pb):
    d = daemon_factory(extra_args=["--auth-tokens", tokens["file"]]).start()
    client, admin = tokens["files"]["client"], tokens["files"]["admin"]

    # no token: refused, except Health
    for args in (["stats"], ["ls"], ["compile", SIN_COS]):
        p = tcctl(d.addr, *args, check=False)
        expect_fail(p, "UNAUTHENTICATED")
        assert "bearer token" in p.stderr
    assert tcctl(d.addr, "health", json_out=False, check=False).returncode == 0
    req = pb.CompileRequest()
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, COMPILE, req.SerializeToString())
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    call(d.addr, HEALTH)  # open

    # wrong token, wrong scheme: refused
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, COMPILE, b"", token=secrets.token_hex(24))
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED and "unknown bearer token" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, COMPILE, b"", token=tokens["tokens"]["client"], scheme="Basic")
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED
    # a token that is a prefix of a real one is not the real one
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, COMPILE, b"", token=tokens["tokens"]["admin"][:-1])
    assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED

    # client token: compile, fetch, read; no evict or gc
    c = tcctl(d.addr, "--token-file", client, "compile", SIN_COS)
    assert c["cache"] == "miss"
    h = c["guard_hash"]
    tcctl(d.addr, "--token-file", client, "stats")
    tcctl(d.addr, "--token-file", client, "ls")
    tcctl(d.addr, "--token-file", client, "show", h)
    tcctl(d.addr, "--token-file", client, "fetch", h, str(tmp_path / "a.so"), json_out=False)
    for args in (["evict", h], ["gc"], ["stats", "--zero"], ["clear", "--yes"], ["warm", "--target", "cpu:x86-64-v3"]):
        p = tcctl(d.addr, "--token-file", client, *args, check=False)
        expect_fail(p, "PERMISSION_DENIED")
        assert "admin token" in p.stderr
    # the same through the environment (libtccclient reads TCCD_TOKEN)
    env = dict(os.environ, TCCD_TOKEN=tokens["tokens"]["client"])
    x = tmp_path / "x.bin"
    x.write_bytes(os.urandom(400))
    p = subprocess.run([TCC_RUN, d.addr, SIN_COS, str(x), str(x), "--", str(tmp_path / "o.bin")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr

    # plans: PutPlan and GetPlan are client calls
    for method, payload in (("/tcc.v1.Cache/GetPlan", pb.GetPlanRequest(key="tccd.k").SerializeToString()),
                            ("/tcc.v1.Cache/PutPlan", pb.PutPlanRequest().SerializeToString())):
        with pytest.raises(grpc.RpcError) as e:
            call(d.addr, method, payload)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, method
        with pytest.raises(grpc.RpcError) as e:  # past auth: the handler's own answer
            call(d.addr, method, payload, token=tokens["tokens"]["client"])
        assert e.value.code() in (grpc.StatusCode.NOT_FOUND, grpc.StatusCode.INVALID_ARGUMENT), method

    assert tcctl(d.addr, "--token-file", client, "stats")["entries"] == 1  # nothing was cleared
    # admin token: everything
    tcctl(d.addr, "--token-file", admin, "gc")
    tcctl(d.addr, "--token-file", admin, "evict", h, json_out=False)
    assert tcctl(d.addr, "--token-file", admin, "compile", SIN_COS)["cache"] == "miss"

    s = tcctl(d.addr, "--token-file", admin, "stats")
    assert s["auth_failures"] >= 9
    assert d.stop() == 0
    log = d.read_log()
    assert "refused: UNAUTHENTICATED" in log and "refused: PERMISSION_DENIED" in log
    for tok in tokens["tokens"].values():
        assert tok not in log, "a token was logged"
        assert tok[:12] not in log


def test_plan_writers(daemon_factory, tokens, tmp_path, pb):
    """--plan-writers admin: PutPlan needs an admin token (GetPlan stays a
    client call); none: no token may hand in plans; a bad value stops the
    daemon at start."""
    put = pb.PutPlanRequest().SerializeToString()
    get = pb.GetPlanRequest(key="tccd.k").SerializeToString()
    d = daemon_factory(extra_args=["--auth-tokens", tokens["file"], "--plan-writers", "admin"]).start()
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, "/tcc.v1.Cache/PutPlan", put, token=tokens["tokens"]["client"])
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "admin token" in e.value.details()
    with pytest.raises(grpc.RpcError) as e:          # past auth: the empty request's own answer
        call(d.addr, "/tcc.v1.Cache/PutPlan", put, token=tokens["tokens"]["admin"])
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, "/tcc.v1.Cache/GetPlan", get, token=tokens["tokens"]["client"])
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    assert d.stop() == 0

    n = daemon_factory(cache_dir=str(tmp_path / "none"), extra_args=["--plan-writers", "none"]).start()
    with pytest.raises(grpc.RpcError) as e:
        call(n.addr, "/tcc.v1.Cache/PutPlan", put)
    assert e.value.code() == grpc.StatusCode.PERMISSION_DENIED and "--plan-writers none" in e.value.details()
    assert n.stop() == 0

    p = run_tccd("--plan-writers", "everyone", tmp_path=tmp_path)
    assert p.returncode != 0 and "--plan-writers expects client, admin or none" in p.stderr


def run_tccd(*args, tmp_path):
    extra = (["--allow-root"] if os.geteuid() == 0 else []) + ["--no-signing"]
    return subprocess.run([TCCD, *extra, "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "c"),
                           *args], capture_output=True, text=True, timeout=30)


def test_bad_token_files_are_refused(tmp_path):
    f = tmp_path / "tokens"
    cases = [
        ("client " + secrets.token_hex(24) + "\n", 0o644, "chmod 600"),
        ("client short\n", 0o600, "16 to 512"),
        ("root " + secrets.token_hex(24) + "\n", 0o600, "role must be 'client' or 'admin'"),
        ("# nothing\n", 0o600, "no tokens"),
        ("client " + "a" * 40 + "\nadmin " + "a" * 40 + "\n", 0o600, "appears twice"),
    ]
    for text, mode, why in cases:
        f.write_text(text)
        f.chmod(mode)
        p = run_tccd("--auth-tokens", str(f), tmp_path=tmp_path)
        assert p.returncode != 0, text
        assert why in p.stderr and "--auth-tokens" in p.stderr, p.stderr
        for secret in (w for w in text.split() if len(w) >= 16):
            assert secret not in p.stderr, "a token was printed"
    p = run_tccd("--auth-tokens", str(tmp_path / "missing"), tmp_path=tmp_path)
    assert p.returncode != 0 and "missing" in p.stderr


def test_listening_beyond_loopback_without_auth_warns(tmp_path):
    """A daemon on a non-loopback address with no --auth-tokens says, at
    start-up, that anyone who reaches the port may compile, evict and gc;
    with tokens, or on loopback, it does not."""
    def startup_log(listen, *args):
        port_file = tmp_path / "port"
        if port_file.exists():
            port_file.unlink()
        extra = (["--allow-root"] if os.geteuid() == 0 else []) + ["--no-signing"]
        log = open(tmp_path / "log", "w+")
        p = subprocess.Popen([TCCD, *extra, "--listen", listen, "--port-file", str(port_file),
                              "--cache-dir", str(tmp_path / "c"), *args], stdout=log, stderr=subprocess.STDOUT)
        try:
            for _ in range(600):
                if port_file.exists() and port_file.read_text().strip():
                    break
                assert p.poll() is None, open(tmp_path / "log").read()
                time.sleep(0.05)
            else:
                raise AssertionError("tccd did not start")
        finally:
            p.terminate()
            p.wait(30)
            log.close()
        return open(tmp_path / "log").read()

    text = startup_log("0.0.0.0:0")
    assert "WITHOUT AUTH" in text and "--auth-tokens" in text and "evict" in text, text
    f = tmp_path / "tokens"
    f.write_text("admin " + secrets.token_hex(24) + "\n")
    f.chmod(0o600)
    assert "WITHOUT AUTH" not in startup_log("0.0.0.0:0", "--auth-tokens", str(f))
    assert "WITHOUT AUTH" not in startup_log("127.0.0.1:0")
