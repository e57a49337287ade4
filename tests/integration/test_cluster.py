"""
The cluster tier: several tccd instances share one redis-server (started
here on a free loopback port with a temporary directory). A graph compiled
on one daemon is a REMOTE_HIT on another, with zero compiles there; many
identical new requests across daemons compile once cluster-wide; a Redis
that is killed, stopped or out of memory costs sharing, never answers, and
the daemons reconnect when it is back; an entry altered in Redis (artifact,
manifest or signature) is refused and compiled again locally.
"""
import os
import shutil
import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest

from conftest import GRAPHS, TCC_RUN, Redis, keygen, compile_on, wait_for, sin_cos_variant as variant

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")


@pytest.fixture
def redis(tmp_path):
    d = tmp_path / "redis"
    d.mkdir()
    r = Redis(str(d)).start()
    yield r
    r.stop()


def keys_of(guard_hash):
    return {part: f"tccd:{{{guard_hash}}}:{part}" for part in ("entry", "artifact", "lock")}


def slow_cc(tmp_path, seconds):
    p = tmp_path / "slow-cc"
    p.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec cc "$@";; esac\nsleep {seconds}\nexec cc "$@"\n')
    p.chmod(0o755)
    return str(p)


def test_remote_hit_on_another_daemon(daemon_factory, redis, signing_key, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"), extra_args=["--redis", redis.url]).start()
    b = daemon_factory(cache_dir=str(tmp_path / "b"), extra_args=["--redis", redis.url]).start()
    pub = signing_key + ".pub"
    first = a.tcctl("compile", SIN_COS)
    assert first["cache"] == "miss"
    wait_for(lambda: a.stats()["remote_stores"] == 1, what="write-through")
    h = first["guard_hash"]
    k = keys_of(h)
    assert redis.cmd("EXISTS", k["entry"], k["artifact"]) == 2
    assert redis.cmd("EXISTS", k["lock"]) == 0, "the lock is dropped with the write-through"
    ttl = redis.cmd("PTTL", k["entry"])
    assert 29 * 86400 * 1000 < ttl <= 30 * 86400 * 1000

    second = b.tcctl("compile", SIN_COS, "--trusted-keys", pub)
    assert second["cache"] == "remote_hit" and second["signature_verified"]
    assert second["artifact_sha256"] == first["artifact_sha256"]
    s = b.stats()
    assert s["compiles"] == 0 and s["misses"] == 0 and s["remote_hits"] == 1
    assert s["remote_enabled"] and s["remote_connected"] and s["remote_address"].endswith(f":{redis.port}/0")
    assert b.tcctl("compile", SIN_COS)["cache"] == "hit", "stored locally on the remote hit"
    # the kernel B serves loads and computes sin(x) + cos(y)
    rng = np.random.default_rng(int.from_bytes(os.urandom(4), "little"))
    x, y = (rng.standard_normal((10, 10)).astype(np.float32) * 3 for _ in range(2))
    (tmp_path / "x").write_bytes(x.tobytes())
    (tmp_path / "y").write_bytes(y.tobytes())
    p = subprocess.run([TCC_RUN, b.addr, SIN_COS, str(tmp_path / "x"), str(tmp_path / "y"), "--",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, TCCD_TRUSTED_KEYS=pub))
    assert p.returncode == 0, p.stderr
    got = np.fromfile(tmp_path / "o", dtype=np.float32).reshape(10, 10)
    np.testing.assert_allclose(got, np.sin(x.astype(np.float64)) + np.cos(y.astype(np.float64)), rtol=1e-5,
                               atol=1e-5)
    # tcctl stats shows both tiers
    human = b.tcctl("stats", json_out=False)
    assert "remote hits          1" in human and f"redis 127.0.0.1:{redis.port}/0 (connected)" in human
    assert a.stop() == 0 and b.stop() == 0


def test_one_compile_cluster_wide(daemon_factory, redis, tmp_path, pb):
    cc = slow_cc(tmp_path, 2)
    ds = [daemon_factory(cache_dir=str(tmp_path / n), extra_args=["--redis", redis.url, "--cc", cc,
                                                                  "--workers", "2"]).start()
          for n in ("a", "b")]
    payload = variant(pb, 7)
    results, errors = [], []
    lock = threading.Lock()

    def one(d):
        try:
            r = compile_on(d, payload, pb)
            with lock:
                results.append(r)
        except grpc.RpcError as e:
            with lock:
                errors.append(e)

    threads = [threading.Thread(target=one, args=(d,)) for d in ds for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors[:3]
    assert len(results) == 64
    assert len({r.artifact.sha256 for r in results}) == 1
    stats = [d.stats() for d in ds]
    assert sum(s["compiles"] for s in stats) == 1, [s["compiles"] for s in stats]
    statuses = sorted(pb.CacheStatus.Name(r.cache) for r in results)
    assert statuses.count("MISS") == 1 and statuses.count("REMOTE_HIT") == 1, statuses
    assert sum(s["remote_lock_waits"] for s in stats) == 1
    for d in ds:
        assert d.stop() == 0


def test_redis_killed_stopped_and_back(daemon_factory, redis, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"),
                       extra_args=["--redis", redis.url, "--redis-timeout-ms", "300"]).start()
    assert compile_on(a, variant(pb, 11), pb).cache == pb.MISS
    redis.kill()
    # every request is still answered: hits locally, misses compiled here
    assert compile_on(a, variant(pb, 11), pb).cache == pb.HIT
    t0 = time.time()
    assert compile_on(a, variant(pb, 12), pb).cache == pb.MISS
    assert compile_on(a, variant(pb, 13), pb).cache == pb.MISS
    assert time.time() - t0 < 10
    s = a.stats()
    assert s["remote_errors"] >= 1 and not s["remote_connected"]
    log = a.read_log()
    assert log.count("serving from the local cache") == 1, "one warning per outage"

    redis.start()  # same port, empty (no persistence)
    wait_for(lambda: a.stats()["remote_connected"], what="reconnect")
    assert "working again" in a.read_log() or "connected" in a.read_log()
    stores = a.stats()["remote_stores"]
    assert compile_on(a, variant(pb, 14), pb).cache == pb.MISS
    wait_for(lambda: a.stats()["remote_stores"] == stores + 1, what="write-through after reconnect")
    b = daemon_factory(cache_dir=str(tmp_path / "b"), extra_args=["--redis", redis.url]).start()
    assert compile_on(b, variant(pb, 14), pb).cache == pb.REMOTE_HIT

    # a hung Redis (SIGSTOP): answers still come, within the remote timeout
    os.kill(redis.proc.pid, signal.SIGSTOP)
    try:
        t0 = time.time()
        assert compile_on(a, variant(pb, 15), pb).cache == pb.MISS
        assert compile_on(b, variant(pb, 16), pb).cache == pb.MISS
        assert time.time() - t0 < 10
    finally:
        os.kill(redis.proc.pid, signal.SIGCONT)
    # out of memory: the write-through fails, the answer does not
    redis.cmd("CONFIG", "SET", "maxmemory", "1")
    errors = a.stats()["remote_errors"]
    assert compile_on(a, variant(pb, 17), pb).cache == pb.MISS
    wait_for(lambda: a.stats()["remote_errors"] > errors, what="OOM counted")
    redis.cmd("CONFIG", "SET", "maxmemory", "0")
    assert "OOM" in a.read_log()
    assert a.stop() == 0 and b.stop() == 0


def test_altered_remote_entries_are_refused(daemon_factory, redis, signing_key, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"), extra_args=["--redis", redis.url]).start()
    first = compile_on(a, variant(pb, 21), pb)
    wait_for(lambda: a.stats()["remote_stores"] == 1, what="write-through")
    k = keys_of(first.guard_hash)
    good_art, good_entry = redis.cmd("GET", k["artifact"]), redis.cmd("GET", k["entry"])

    def daemon_b(name, *extra):
        return daemon_factory(cache_dir=str(tmp_path / name), extra_args=["--redis", redis.url, *extra]).start()

    # 1. a byte of the artifact flipped
    bad = bytearray(good_art)
    bad[len(bad) // 3] ^= 0x20
    redis.cmd("SET", k["artifact"], bytes(bad), "KEEPTTL")
    b = daemon_b("b1")
    r = compile_on(b, variant(pb, 21), pb)
    assert r.cache == pb.MISS, "refused, compiled locally"
    s = b.stats()
    assert s["remote_rejected"] == 1 and s["compiles"] == 1
    assert "refused the remote entry" in b.read_log() and "digest" in b.read_log()
    # ... and B's write-through repaired it
    wait_for(lambda: redis.cmd("GET", k["artifact"]) == good_art, what="repair")
    assert b.stop() == 0

    # 2. the manifest altered inside the entry (its signature no longer holds)
    e = pb.RemoteEntry.FromString(good_entry)
    e.manifest = e.manifest.replace(b"x86-64-v2", b"x86-64-v3")
    redis.cmd("SET", k["entry"], e.SerializeToString(), "KEEPTTL")
    b = daemon_b("b2")
    assert compile_on(b, variant(pb, 21), pb).cache == pb.MISS
    assert b.stats()["remote_rejected"] == 1 and "signature invalid" in b.read_log()
    assert b.stop() == 0

    # 3. a daemon with another key does not trust A's signature, unless told
    redis.cmd("SET", k["entry"], good_entry, "KEEPTTL")
    redis.cmd("SET", k["artifact"], good_art, "KEEPTTL")
    other = keygen(tmp_path / "other.key")
    b = daemon_factory(cache_dir=str(tmp_path / "b3"), signing_key=other,
                       extra_args=["--redis", redis.url]).start()
    assert compile_on(b, variant(pb, 21), pb).cache == pb.MISS
    assert b.stats()["remote_rejected"] == 1 and "not trusted" in b.read_log()
    assert b.stop() == 0
    redis.cmd("SET", k["entry"], good_entry, "KEEPTTL")
    redis.cmd("SET", k["artifact"], good_art, "KEEPTTL")
    b = daemon_factory(cache_dir=str(tmp_path / "b4"), signing_key=other,
                       extra_args=["--redis", redis.url, "--trusted-keys", signing_key + ".pub"]).start()
    r = compile_on(b, variant(pb, 21), pb)
    assert r.cache == pb.REMOTE_HIT and r.artifact.key_id == first.artifact.key_id
    assert b.stop() == 0 and a.stop() == 0


def test_redis_password_and_bad_url(daemon_factory, tmp_path, pb):
    d = tmp_path / "redis"
    d.mkdir()
    r = Redis(str(d), args=["--requirepass", "s3cret-pass"]).start()
    try:
        a = daemon_factory(cache_dir=str(tmp_path / "a"),
                           extra_args=["--redis", f"redis://:s3cret-pass@127.0.0.1:{r.port}/2"]).start()
        resp = compile_on(a, variant(pb, 31), pb)
        wait_for(lambda: a.stats()["remote_stores"] == 1, what="write-through with AUTH")
        assert r.cmd("SELECT", "2", password="s3cret-pass") == "OK"
        assert "s3cret-pass" not in a.read_log(), "the password is never logged"
        assert a.stats()["remote_address"] == f"127.0.0.1:{r.port}/2"
        assert resp.cache == pb.MISS
        # a wrong password: errors are counted, every request is answered
        b = daemon_factory(cache_dir=str(tmp_path / "b"),
                           extra_args=["--redis", f"redis://:wrong-pass@127.0.0.1:{r.port}"]).start()
        assert compile_on(b, variant(pb, 32), pb).cache == pb.MISS
        wait_for(lambda: b.stats()["remote_errors"] >= 1, what="auth errors counted")
        assert a.stop() == 0 and b.stop() == 0
    finally:
        r.stop()
    bad = daemon_factory(cache_dir=str(tmp_path / "c"), extra_args=["--redis", "http://x"])
    with pytest.raises(RuntimeError) as e:
        bad.start()
    assert "redis://" in str(e.value)
