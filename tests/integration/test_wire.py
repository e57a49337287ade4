"""
Wire compatibility with an independent gRPC implementation: Python grpcio
with messages generated from proto/ by grpcio-tools (not our C code).
"""
import os
import stat
import threading

import grpc
import pytest

from conftest import load_request_json

COMPILE = "/tcc.v1.Compiler/Compile"


def raw_unary(addr, method, payload, timeout=30):
    with grpc.insecure_channel(addr) as ch:
        call = ch.unary_unary(method, request_serializer=None, response_deserializer=None)
        return call(payload, timeout=timeout)


def request_message(pb, name="sin_cos.json"):
    from google.protobuf import json_format
    return json_format.ParseDict(load_request_json(name), pb.CompileRequest())


def test_python_built_request_round_trip(daemon, pb):
    req = request_message(pb)
    resp = pb.CompileResponse.FromString(raw_unary(daemon.addr, COMPILE, req.SerializeToString()))
    assert resp.cache == pb.MISS
    assert len(resp.guard_hash) == 64
    assert resp.artifact.kind == pb.SHARED_OBJECT and resp.artifact.size > 0
    assert resp.manifest.entry == "tcc_entry" and resp.manifest.abi_version == 1
    assert list(resp.manifest.outputs[0].sizes) == [10, 10]
    again = pb.CompileResponse.FromString(raw_unary(daemon.addr, COMPILE, req.SerializeToString()))
    assert again.cache == pb.HIT and again.guard_hash == resp.guard_hash
    assert again.manifest == resp.manifest

    # the streamed Fetch reassembles into the digest the response named
    import hashlib
    with grpc.insecure_channel(daemon.addr) as ch:
        fetch = ch.unary_stream("/tcc.v1.Compiler/Fetch", request_serializer=None,
                                response_deserializer=pb.ArtifactChunk.FromString)
        chunks = list(fetch(pb.FetchRequest(sha256=resp.artifact.sha256, chunk_bytes=1000)
                            .SerializeToString(), timeout=30))
    assert len(chunks) > 1, "a 1000-byte chunk size must split the artifact"
    assert chunks[0].artifact.sha256 == resp.artifact.sha256
    data = b"".join(c.data for c in chunks)
    assert [c.offset for c in chunks] == [i * 1000 for i in range(len(chunks))]
    assert hashlib.sha256(data).hexdigest() == resp.artifact.sha256


def test_garbage_bytes_are_invalid_argument(daemon):
    for payload in (b"\xff\xff\xff\xff garbage", b"\x0a\x80", b"\x12\x05abc"):
        with pytest.raises(grpc.RpcError) as e:
            raw_unary(daemon.addr, COMPILE, payload)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, payload
        assert "CompileRequest" in e.value.details() or "graph" in e.value.details()
    # still serving
    assert raw_unary(daemon.addr, "/grpc.health.v1.Health/Check", b"") == b"\x08\x01"


def test_unknown_method_is_unimplemented(daemon):
    for method in ("/tcc.v1.Compiler/Nope", "/no.such.Service/Call"):
        with pytest.raises(grpc.RpcError) as e:
            raw_unary(daemon.addr, method, b"", timeout=10)
        assert e.value.code() == grpc.StatusCode.UNIMPLEMENTED
        assert method in e.value.details()


def test_health_check(daemon):
    # HealthCheckResponse{status: SERVING} is field 1 = 1: b"\x08\x01"
    assert raw_unary(daemon.addr, "/grpc.health.v1.Health/Check", b"") == b"\x08\x01"
    svc = b"\x0a\x0ftcc.v1.Compiler"
    assert raw_unary(daemon.addr, "/grpc.health.v1.Health/Check", svc) == b"\x08\x01"
    with pytest.raises(grpc.RpcError) as e:
        raw_unary(daemon.addr, "/grpc.health.v1.Health/Check", b"\x0a\x03foo")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND


def slow_cc(tmp_path, seconds):
    """A C compiler that answers --version at once and sleeps before compiling."""
    p = tmp_path / "slow-cc"
    p.write_text(f"""#!/bin/sh
case "$*" in *--version*) exec cc "$@";; esac
sleep {seconds}
exec cc "$@"
""")
    p.chmod(p.stat().st_mode | stat.S_IEXEC)
    return str(p)


def test_short_deadline_is_deadline_exceeded(daemon_factory, tmp_path, pb):
    d = daemon_factory(extra_args=["--cc", slow_cc(tmp_path, 2)]).start()
    req = request_message(pb).SerializeToString()
    with pytest.raises(grpc.RpcError) as e:
        raw_unary(d.addr, COMPILE, req, timeout=0.3)
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    # the compile went on and was stored: the next request hits
    import time
    deadline = time.time() + 30
    while d.stats()["compiles"] < 1 and time.time() < deadline:
        time.sleep(0.1)
    resp = pb.CompileResponse.FromString(raw_unary(d.addr, COMPILE, req))
    assert resp.cache == pb.HIT
    assert d.stop() == 0


def test_concurrent_identical_requests_compile_once(daemon_factory, tmp_path, pb):
    d = daemon_factory(extra_args=["--cc", slow_cc(tmp_path, 1)]).start()
    req = request_message(pb).SerializeToString()
    results, errors = [], []
    barrier = threading.Barrier(64)

    def one():
        try:
            barrier.wait()
            results.append(pb.CompileResponse.FromString(raw_unary(d.addr, COMPILE, req, timeout=60)))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(64)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]
    assert len(results) == 64
    assert len({r.artifact.sha256 for r in results}) == 1
    statuses = sorted(pb.CacheStatus.Name(r.cache) for r in results)
    assert statuses.count("MISS") == 1
    assert set(statuses) <= {"MISS", "COALESCED", "HIT"}
    s = d.stats()
    assert s["compiles"] == 1
    assert s["coalesced"] + s["hits"] == 63
    assert d.stop() == 0


def test_ops_lists_what_the_daemon_compiles(daemon, pb):
    resp = pb.OpsResponse.FromString(raw_unary(daemon.addr, "/tcc.v1.Compiler/Ops",
                                               pb.OpsRequest(device=pb.CPU).SerializeToString()))
    targets = {op.target: op for op in resp.ops}
    for t in ("aten.add.Tensor", "aten.sin.default", "aten.cos.default", "aten.relu.default"):
        assert t in targets, t
    assert targets["aten.add.Tensor"].schema.startswith("add.Tensor(Tensor self, Tensor other")
    assert targets["aten.add.Tensor"].kind == "pointwise"
    assert pb.FLOAT32 in resp.dtypes and pb.FLOAT64 in resp.dtypes
    assert resp.compiler.startswith("tccd-codegen/")
    # every listed op's schema names the op itself
    for t, op in targets.items():
        assert op.schema.split("(")[0] == ".".join(t.split(".")[1:]).replace(".default", ""), t
