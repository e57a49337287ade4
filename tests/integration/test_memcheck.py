"""
The daemon under valgrind: a session of misses, hits, fetches, admin calls,
a warm run, a build from the object cache, plans kept, served and refused, bad requests and a clean SIGTERM must leak nothing from project code
(definite and indirect leaks are errors; gRPC/Abseil globals are
suppressed in valgrind.supp) and make no invalid reads or writes.
"""
import os
import shutil
import time

import grpc
import pytest

from conftest import GRAPHS, Redis, sin_cos_request

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")
SUPP = os.path.join(os.path.dirname(__file__), "valgrind.supp")


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_daemon_session_under_valgrind(daemon_factory, tmp_path):
    vg_log = tmp_path / "valgrind.log"
    wrapper = ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
               "--show-leak-kinds=definite,indirect", "--error-exitcode=99",
               f"--suppressions={SUPP}", f"--log-file={vg_log}"]
    d = daemon_factory(wrapper=wrapper, extra_args=["--workers", "2"]).start(timeout=180)
    c = d.tcctl("compile", SIN_COS, timeout=300)
    assert c["cache"] == "miss"
    assert d.tcctl("compile", SIN_COS, timeout=300)["cache"] == "hit"
    d.tcctl("fetch", c["guard_hash"], str(tmp_path / "a.so"), json_out=False, timeout=300)
    d.tcctl("stats", timeout=300)
    d.tcctl("ls", timeout=300)
    d.tcctl("show", c["guard_hash"], timeout=300)
    d.tcctl("gc", timeout=300)
    d.tcctl("explain", c["guard_hash"], timeout=300)           # the Explain machine, both offload steps
    d.tcctl("explain", "--target", "cpu:x86-64", SIN_COS, timeout=300)
    d.tcctl("jobs", timeout=300)
    d.tcctl("ls", "--failures", timeout=300)
    w = d.tcctl("warm", "--target", "cpu:x86-64-v3", timeout=300)  # a warm run: offload, detached job
    assert w["done"] and w["compiled"] == 1, w
    d.tcctl("warm", "--id", str(w["warm_id"]), "--no-wait", timeout=300)
    v3 = tmp_path / "sin_cos_v3.json"
    v3.write_text(open(SIN_COS).read().replace('"cpuIsa": "x86-64-v2"', '"cpuIsa": "x86-64-v3"'))
    assert d.tcctl("compile", str(v3), timeout=300)["cache"] == "hit"
    ro = tmp_path / "sin_cos_ro.json"  # another key, the same body: linked from the object cache
    ro.write_text(open(SIN_COS).read().replace('"mode": "DEFAULT"', '"mode": "REDUCE_OVERHEAD"'))
    assert d.tcctl("compile", str(ro), timeout=300)["cache"] == "miss"
    assert d.tcctl("stats", timeout=300)["object_hits"] >= 1
    from tccd._proto import tcc_pb2 as tpb
    from tccd.client import Client
    from tccd.errors import TccdError

    with Client(d.addr, deadline_ms=300000) as cl:   # plans: kept (offload), served, refused
        req = sin_cos_request(tpb, 7)
        cl.compile(req)
        plan = tpb.Plan(format=1, key="tccdmemcheck", torch_version="t", package="p")
        plan.forward.kind = "forward"
        plan.forward.partitions.add(name="p0", has_kernel=True).kernels.add(outputs=1).request.CopyFrom(req)
        assert cl.put_plan(plan) and not cl.put_plan(plan)
        assert tpb.Plan.FromString(cl.get_plan("tccdmemcheck")[0]).key == "tccdmemcheck"
        assert cl.get_plan("tccdnone") is None
        plan.key = "tccdother"
        plan.forward.partitions[0].kernels[0].request.CopyFrom(sin_cos_request(tpb, 8))  # not compiled
        with pytest.raises(TccdError):
            cl.put_plan(plan)
    with grpc.insecure_channel(d.addr) as ch:
        for method, payload in (("/tcc.v1.Compiler/Compile", b"\xff\xfe garbage"),
                                ("/tcc.v1.Nope/Nope", b"")):
            with pytest.raises(grpc.RpcError):
                ch.unary_unary(method, request_serializer=None, response_deserializer=None)(payload, timeout=60)
    d.tcctl("evict", c["guard_hash"], json_out=False, timeout=300)
    rc = d.stop(timeout=180)
    log = vg_log.read_text()
    assert rc == 0, f"valgrind exit {rc}:\n{log[-6000:]}"
    assert "ERROR SUMMARY: 0 errors" in log, log[-6000:]


@pytest.mark.skipif(shutil.which("valgrind") is None or shutil.which("redis-server") is None,
                    reason="valgrind or redis-server is not installed")
def test_daemon_with_redis_under_valgrind(daemon_factory, tmp_path):
    """The remote tier under valgrind: a remote hit (another daemon's
    write-through), a plan read from Redis, an evict reaching Redis, write-through, Redis killed
    mid-run (an evict that reports it, errors, local compiles, reconnect
    attempts), a clean SIGTERM while disconnected."""
    rdir = tmp_path / "redis"
    rdir.mkdir()
    r = Redis(str(rdir)).start()
    vg_log = tmp_path / "valgrind-redis.log"
    wrapper = ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
               "--show-leak-kinds=definite,indirect", "--error-exitcode=99",
               f"--suppressions={SUPP}", f"--log-file={vg_log}"]
    try:
        wdir = tmp_path / "writer"
        wdir.mkdir()
        w = daemon_factory(cache_dir=str(tmp_path / "writer-cache"), workdir=str(wdir),
                           extra_args=["--redis", r.url]).start()
        c = w.tcctl("compile", SIN_COS)
        assert c["cache"] == "miss"
        deadline = time.time() + 60
        while w.stats()["remote_stores"] < 1 and time.time() < deadline:
            time.sleep(0.1)
        from tccd._proto import tcc_pb2 as tpb
        from tccd.client import Client

        with Client(w.addr) as cl:                   # a plan written through to Redis
            req = sin_cos_request(tpb, 7)
            cl.compile(req)
            plan = tpb.Plan(format=1, key="tccdmemcheck", torch_version="t", package="p")
            plan.forward.kind = "forward"
            plan.forward.partitions.add(name="p0", has_kernel=True).kernels.add(outputs=1).request.CopyFrom(req)
            assert cl.put_plan(plan)
        assert w.stop() == 0
        d = daemon_factory(wrapper=wrapper, extra_args=["--workers", "2", "--redis", r.url,
                                                        "--redis-timeout-ms", "2000"]).start(timeout=180)
        assert d.tcctl("compile", SIN_COS, timeout=300)["cache"] == "remote_hit"
        with Client(d.addr, deadline_ms=300000) as cl:   # the plan read back: verified, kept, then a local hit
            assert cl.get_plan("tccdmemcheck")[1] == tpb.REMOTE_HIT
            assert cl.get_plan("tccdmemcheck")[1] == tpb.HIT
        out = d.tcctl("evict", c["guard_hash"], timeout=300)
        assert out["evicted"] and out["remote_removed"] == ["entry", "artifact"]
        assert d.tcctl("compile", SIN_COS, timeout=300)["cache"] == "miss"
        deadline = time.time() + 60
        while d.stats()["remote_stores"] < 1 and time.time() < deadline:
            time.sleep(0.1)
        r.kill()
        p = d.tcctl("evict", c["guard_hash"], json_out=False, check=False, timeout=300)
        assert p.returncode == 1 and p.stdout.startswith("evicted ") and "UNAVAILABLE" in p.stderr
        assert d.tcctl("compile", SIN_COS, timeout=300)["cache"] == "miss"
        assert d.stats()["remote_errors"] >= 1
        rc = d.stop(timeout=180)
    finally:
        r.stop()
    log = vg_log.read_text()
    assert rc == 0, f"valgrind exit {rc}:\n{log[-6000:]}"
    assert "ERROR SUMMARY: 0 errors" in log, log[-6000:]
