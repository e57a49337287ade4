"""
The compile pool under pressure: a full queue answers RESOURCE_EXHAUSTED at
once, a compile over its time limit is DEADLINE_EXCEEDED (and retried next
time), a deterministic failure goes to the negative cache (answered again
without recompiling until `tcctl evict`), and the daemon keeps serving
through all of it.
"""
import json
import threading
import time

import grpc
import pytest

from conftest import sin_cos_variant as variant

COMPILE = "/tcc.v1.Compiler/Compile"


def fake_cc(tmp_path, name, body):
    """A C compiler wrapper: answers --version like cc, else runs body."""
    p = tmp_path / name
    p.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec cc "$@";; esac\n{body}\n')
    p.chmod(0o755)
    return str(p)


def call(addr, payload, timeout=60):
    with grpc.insecure_channel(addr) as ch:
        return ch.unary_unary(COMPILE, request_serializer=None, response_deserializer=None)(
            payload, timeout=timeout)


def test_full_queue_is_resource_exhausted(daemon_factory, tmp_path, pb):
    cc = fake_cc(tmp_path, "slow-cc", 'sleep 2; exec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc, "--workers", "1", "--queue-max", "1"]).start()
    results = {}

    def submit(rows):
        try:
            results[rows] = pb.CompileResponse.FromString(call(d.addr, variant(pb, rows)))
        except grpc.RpcError as e:
            results[rows] = e

    first = [threading.Thread(target=submit, args=(r,)) for r in (1, 2)]
    for t in first:
        t.start()
    time.sleep(0.5)  # one compiling, one queued
    t0 = time.time()
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, variant(pb, 3))
    assert time.time() - t0 < 1.0, "a full queue must answer at once"
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "queue full" in e.value.details()
    for t in first:
        t.join(60)
    assert all(isinstance(results[r], pb.CompileResponse) for r in (1, 2)), results
    # once the queue drains, the refused graph compiles
    assert pb.CompileResponse.FromString(call(d.addr, variant(pb, 3))).cache == pb.MISS
    assert d.stop() == 0


def test_compile_timeout(daemon_factory, tmp_path, pb):
    cc = fake_cc(tmp_path, "hung-cc", 'sleep 30; exec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc, "--compile-timeout-ms", "500"]).start()
    t0 = time.time()
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, variant(pb, 4))
    assert time.time() - t0 < 10
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    s = d.stats()
    assert s["compile_failures"] == 1 and s["negative_entries"] == 0, "a timeout is not recorded"
    # the daemon keeps serving (health); the same graph backs off (answered
    # at once, not compiled again: test_failures.py follows it further)
    assert d.tcctl("health", json_out=False, check=False).returncode == 0
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, variant(pb, 4))
    assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "not tried again" in e.value.details()
    assert d.stats()["compile_failures"] == 1
    assert d.stop() == 0


def test_negative_cache(daemon_factory, tmp_path, pb):
    cc = fake_cc(tmp_path, "broken-cc", 'echo "broken-cc: internal compiler error" >&2; exit 1')
    d = daemon_factory(extra_args=["--cc", cc]).start()
    req = variant(pb, 5)
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, req)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "internal compiler error" in e.value.details()
    s = d.stats()
    assert s["compile_failures"] == 1 and s["negative_entries"] == 1

    with pytest.raises(grpc.RpcError) as e2:
        call(d.addr, req)
    assert e2.value.code() == grpc.StatusCode.INTERNAL
    assert "recorded failure" in e2.value.details()
    s = d.stats()
    assert s["compile_failures"] == 1, "answered from the negative cache, not recompiled"
    assert s["negative_hits"] == 1

    # it survives a restart, and `tcctl evict` clears it
    assert d.stop() == 0
    d.start()
    with pytest.raises(grpc.RpcError) as e3:
        call(d.addr, req)
    assert "recorded failure" in e3.value.details()
    detail = e3.value.details()
    h = detail.split("guard hash ")[1].split(";")[0]
    assert len(h) == 64
    d.tcctl("evict", h, json_out=False)
    with pytest.raises(grpc.RpcError):
        call(d.addr, req)
    assert d.stats()["compile_failures"] == 2, "after evict the graph is compiled again"
    assert d.stop() == 0


def test_compiler_memory_is_limited(daemon_factory, tmp_path, pb):
    """The C compiler runs under resource limits: one that tries to take
    6 GiB is stopped (address-space limit 4 GiB), the failure is reported
    with the compiler's own words, and the daemon keeps serving."""
    cc = fake_cc(tmp_path, "greedy-cc",
                 'python3 -c "b = bytearray(6 << 30); print(len(b))" || exit 1\nexec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc]).start()
    with pytest.raises(grpc.RpcError) as e:
        call(d.addr, variant(pb, 6))
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "MemoryError" in e.value.details()
    assert d.tcctl("health", json_out=False, check=False).returncode == 0
    assert d.stop() == 0
