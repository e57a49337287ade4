"""
The remote tier on a real Redis Cluster: three cluster-enabled
redis-server masters on free loopback ports (slots split with CLUSTER
ADDSLOTSRANGE, joined with CLUSTER MEET), and two or three tccd. Keys of
many guard hashes spread over the masters, each hash's keys in one slot; a
daemon that knows one node follows the others; a resharded slot is
followed through MOVED, a slot being migrated through ASK (and TRYAGAIN);
one compile cluster-wide for an identical burst; a killed master costs
sharing, never answers; a deterministic compile failure on one daemon is
answered on another without compiling, and an altered failure record is
refused.
"""
import json
import os
import re
import shutil
import threading
import time

import grpc
import pytest

from conftest import RedisCluster, compile_on, wait_for, sin_cos_variant as variant

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")



@pytest.fixture
def rcluster(tmp_path):
    d = tmp_path / "rcluster"
    d.mkdir()
    c = RedisCluster(str(d), masters=3).start()
    yield c
    c.stop()


def keys_of(h):
    return {part: f"tccd:{{{h}}}:{part}" for part in ("entry", "artifact", "lock", "failure")}


def own_dir(tmp_path, name):
    """A workdir per daemon, so each has its own log."""
    d = tmp_path / f"run-{name}"
    d.mkdir(exist_ok=True)
    return str(d)


def fake_cc(tmp_path, name, body):
    """A C compiler wrapper: answers --version like cc, else runs body."""
    p = tmp_path / name
    p.write_text(f'#!/bin/sh\ncase "$*" in *--version*) exec cc "$@";; esac\n{body}\n')
    p.chmod(0o755)
    return str(p)


def move_slot(c, slot, src, dst, keys, finish=True):
    """Reshards `slot` from src to dst as redis-cli would: IMPORTING on dst,
    MIGRATING on src, MIGRATE the keys, then (finish) SETSLOT NODE on every
    master."""
    src_id, dst_id = c.node_id(src), c.node_id(dst)
    assert dst.cmd("CLUSTER", "SETSLOT", slot, "IMPORTING", src_id) == "OK"
    assert src.cmd("CLUSTER", "SETSLOT", slot, "MIGRATING", dst_id) == "OK"
    assert src.cmd("MIGRATE", "127.0.0.1", dst.port, "", 0, 5000, "KEYS", *keys) == "OK"
    if finish:
        for n in [dst, src] + [n for n in c.nodes if n not in (src, dst)]:
            assert n.cmd("CLUSTER", "SETSLOT", slot, "NODE", dst_id) == "OK"


def test_cluster_spread_and_remote_hit(daemon_factory, rcluster, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=own_dir(tmp_path, "a"),
                       extra_args=["--redis", rcluster.url()]).start()
    # B knows one node only: it finds the other masters from CLUSTER SLOTS
    b = daemon_factory(cache_dir=str(tmp_path / "b"), workdir=own_dir(tmp_path, "b"),
                       extra_args=["--redis", rcluster.url(rcluster.nodes[0])]).start()
    rows = list(range(2, 14))
    hashes = [compile_on(a, variant(pb, r), pb).guard_hash for r in rows]
    wait_for(lambda: a.stats()["remote_stores"] == len(rows), what="write-through")
    owners = set()
    for h in hashes:
        k = keys_of(h)
        slots = {rcluster.nodes[0].cmd("CLUSTER", "KEYSLOT", key) for key in k.values()}
        assert len(slots) == 1, "entry, artifact, lock and failure of a hash share one slot"
        owner = rcluster.owner(k["entry"])
        owners.add(owner.port)
        assert {k["entry"], k["artifact"]} <= rcluster.keys(owner)
        for other in rcluster.nodes:
            if other is not owner:
                assert not rcluster.keys(other, f"tccd:{{{h}}}:*")
    assert len(owners) >= 2, "12 guard hashes spread over several masters"

    for r, h in zip(rows, hashes):
        resp = compile_on(b, variant(pb, r), pb)
        assert resp.cache == pb.REMOTE_HIT and resp.guard_hash == h
    s = b.stats()
    assert s["compiles"] == 0 and s["misses"] == 0 and s["remote_hits"] == len(rows)
    assert s["remote_connected"] and s["remote_errors"] == 0
    assert "a cluster; slot map loaded" in b.read_log()
    assert a.stop() == 0 and b.stop() == 0


def test_cluster_moved_and_ask(daemon_factory, rcluster, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=own_dir(tmp_path, "a"),
                       extra_args=["--redis", rcluster.url()]).start()
    b = daemon_factory(cache_dir=str(tmp_path / "b"), workdir=own_dir(tmp_path, "b"),
                       extra_args=["--redis", rcluster.url()]).start()
    wait_for(lambda: "slot map loaded" in b.read_log(), what="B's slot map")
    hx = compile_on(a, variant(pb, 40), pb).guard_hash
    hy = compile_on(a, variant(pb, 41), pb).guard_hash
    wait_for(lambda: a.stats()["remote_stores"] == 2, what="write-through")

    # MOVED: X's slot is resharded after B loaded its map
    kx = keys_of(hx)
    slot = rcluster.nodes[0].cmd("CLUSTER", "KEYSLOT", kx["entry"])
    src = rcluster.owner(kx["entry"])
    dst = next(n for n in rcluster.nodes if n is not src)
    move_slot(rcluster, slot, src, dst, [kx["entry"], kx["artifact"]])
    assert {kx["entry"], kx["artifact"]} <= rcluster.keys(dst)
    r = compile_on(b, variant(pb, 40), pb)
    assert r.cache == pb.REMOTE_HIT
    assert f"MOVED {slot} 127.0.0.1:{dst.port}" in b.read_log()

    # ASK: Y's slot is being migrated (its keys moved, the slot not yet handed over)
    ky = keys_of(hy)
    slot_y = rcluster.nodes[0].cmd("CLUSTER", "KEYSLOT", ky["entry"])
    src = rcluster.owner(ky["entry"])
    dst = next(n for n in rcluster.nodes if n is not src)
    move_slot(rcluster, slot_y, src, dst, [ky["entry"], ky["artifact"]], finish=False)
    r = compile_on(b, variant(pb, 41), pb)
    assert r.cache == pb.REMOTE_HIT, "read from the importing node through ASK"
    log = b.read_log()
    assert f"ASK {slot_y} 127.0.0.1:{dst.port}" in log
    assert "TRYAGAIN" in log, "the 4-key MGET on the importing node is read key by key"
    # the map was not changed by ASK: the source still owns the slot for B
    s = b.stats()
    assert s["compiles"] == 0 and s["remote_hits"] == 2 and s["remote_errors"] == 0
    assert a.stop() == 0 and b.stop() == 0
    m = re.search(r"(\d+) MOVED and (\d+) ASK redirection", b.read_log())
    assert m and int(m.group(1)) >= 1 and int(m.group(2)) >= 1, "counted and logged at shutdown"


def test_cluster_one_compile_for_a_burst(daemon_factory, rcluster, tmp_path, pb):
    cc = fake_cc(tmp_path, "slow-cc", 'sleep 2; exec cc "$@"')
    ds = [daemon_factory(cache_dir=str(tmp_path / n), workdir=own_dir(tmp_path, n),
                         extra_args=["--redis", rcluster.url(rcluster.nodes[i]), "--cc", cc, "--workers", "2"]).start()
          for i, n in enumerate(("a", "b"))]
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
    assert len(results) == 64 and len({r.artifact.sha256 for r in results}) == 1
    stats = [d.stats() for d in ds]
    assert sum(s["compiles"] for s in stats) == 1, [s["compiles"] for s in stats]
    statuses = sorted(pb.CacheStatus.Name(r.cache) for r in results)
    assert statuses.count("MISS") == 1 and statuses.count("REMOTE_HIT") == 1, statuses
    for d in ds:
        assert d.stop() == 0


def test_cluster_node_killed(daemon_factory, rcluster, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=own_dir(tmp_path, "a"),
                       extra_args=["--redis", rcluster.url(), "--redis-timeout-ms", "300"]).start()
    h = compile_on(a, variant(pb, 50), pb).guard_hash
    wait_for(lambda: a.stats()["remote_stores"] == 1, what="write-through")
    victim = rcluster.owner(keys_of(h)["entry"])
    victim.kill()
    t0 = time.time()
    assert compile_on(a, variant(pb, 50), pb).cache == pb.HIT, "served from the local cache"
    for rows in range(60, 66):  # some hash to the dead master, the rest to live ones
        assert compile_on(a, variant(pb, rows), pb).cache == pb.MISS
    assert time.time() - t0 < 30
    s = a.stats()
    assert s["compiles"] == 7 and s["remote_errors"] >= 1
    assert "serving from the local cache" in a.read_log()
    assert a.stop() == 0


def test_cluster_negative_cache_shared(daemon_factory, rcluster, tmp_path, pb):
    cc = fake_cc(tmp_path, "broken-cc", 'echo "broken-cc: internal compiler error" >&2; exit 1')

    def daemon(name, *nodes):
        return daemon_factory(cache_dir=str(tmp_path / name), workdir=own_dir(tmp_path, name),
                              extra_args=["--redis", rcluster.url(*nodes), "--cc", cc]).start()

    a = daemon("a")
    req = variant(pb, 70)
    with pytest.raises(grpc.RpcError) as e:
        compile_on(a, req, pb)
    assert e.value.code() == grpc.StatusCode.INTERNAL and "internal compiler error" in e.value.details()
    assert a.stats()["compile_failures"] == 1

    def failure_keys():
        return set().union(*(rcluster.keys(n, "tccd:*:failure") for n in rcluster.nodes))

    wait_for(lambda: len(failure_keys()) == 1, what="the failure record in the cluster")
    fkey = failure_keys().pop()
    owner = rcluster.owner(fkey)
    ttl = owner.cmd("PTTL", fkey)
    assert 86000 * 1000 < ttl <= 86400 * 1000, "failures live --failure-ttl (1d), under the entries' TTL"
    assert owner.cmd("EXISTS", fkey.replace(":failure", ":lock")) == 0, "the lock is dropped"

    # B (seeded with another node) answers the same error without compiling
    b = daemon("b", rcluster.nodes[2])
    with pytest.raises(grpc.RpcError) as e:
        compile_on(b, req, pb)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert "internal compiler error" in e.value.details() and "shared through the remote tier" in e.value.details()
    s = b.stats()
    assert s["compile_failures"] == 0 and s["compiles"] == 0 and s["misses"] == 0 and s["negative_hits"] == 1
    # ... and recorded it locally: the next answer needs no Redis
    with pytest.raises(grpc.RpcError) as e:
        compile_on(b, req, pb)
    assert "recorded failure" in e.value.details() and b.stats()["negative_hits"] == 2

    # an altered failure record (its signature no longer holds) is refused
    rec = pb.RemoteFailure.FromString(owner.cmd("GET", fkey))
    assert rec.code == -13 and len(rec.signature) == 64 and rec.key_id
    rec.message = "PERMANENTLY BROKEN: do not retry"
    owner.cmd("SET", fkey, rec.SerializeToString(), "KEEPTTL")
    c = daemon("c")
    with pytest.raises(grpc.RpcError) as e:
        compile_on(c, req, pb)
    assert "PERMANENTLY" not in e.value.details() and "internal compiler error" in e.value.details()
    s = c.stats()
    assert s["remote_rejected"] == 1 and s["compile_failures"] == 1, "compiled (and failed) itself"
    assert "refused the remote failure record" in c.read_log()
    for d in (a, b, c):
        assert d.stop() == 0


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="valgrind is not installed")
def test_cluster_paths_under_valgrind(daemon_factory, rcluster, tmp_path, pb):
    """redis_cluster.c under valgrind: slot map, MOVED, ASK with a split
    MGET, a shared failure, a killed master, SIGTERM with nodes down."""
    supp = os.path.join(os.path.dirname(__file__), "valgrind.supp")
    vg_log = tmp_path / "valgrind-cluster.log"
    wrapper = ["valgrind", "--leak-check=full", "--errors-for-leak-kinds=definite,indirect",
               "--show-leak-kinds=definite,indirect", "--error-exitcode=99",
               f"--suppressions={supp}", f"--log-file={vg_log}"]
    a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=own_dir(tmp_path, "a"),
                       extra_args=["--redis", rcluster.url()]).start()
    broken = fake_cc(tmp_path, "broken-cc", 'echo "broken-cc: internal compiler error" >&2; exit 1')
    f = daemon_factory(cache_dir=str(tmp_path / "f"), workdir=own_dir(tmp_path, "f"),
                       extra_args=["--redis", rcluster.url(), "--cc", broken]).start()
    with pytest.raises(grpc.RpcError):
        compile_on(f, variant(pb, 86), pb)
    assert f.stop() == 0
    hx = compile_on(a, variant(pb, 80), pb).guard_hash
    hy = compile_on(a, variant(pb, 81), pb).guard_hash
    wait_for(lambda: a.stats()["remote_stores"] == 2, what="write-through")
    v = daemon_factory(cache_dir=str(tmp_path / "v"), workdir=own_dir(tmp_path, "v"), wrapper=wrapper,
                       extra_args=["--redis", rcluster.url(rcluster.nodes[0]), "--redis-timeout-ms", "2000",
                                   "--workers", "2"]).start(timeout=180)
    wait_for(lambda: "slot map loaded" in v.read_log(), timeout=60, what="the slot map")
    kx, ky = keys_of(hx), keys_of(hy)
    src = rcluster.owner(kx["entry"])
    move_slot(rcluster, rcluster.nodes[0].cmd("CLUSTER", "KEYSLOT", kx["entry"]), src,
              next(n for n in rcluster.nodes if n is not src), [kx["entry"], kx["artifact"]])
    assert compile_on(v, variant(pb, 80), pb, timeout=300).cache == pb.REMOTE_HIT
    src = rcluster.owner(ky["entry"])
    move_slot(rcluster, rcluster.nodes[0].cmd("CLUSTER", "KEYSLOT", ky["entry"]), src,
              next(n for n in rcluster.nodes if n is not src), [ky["entry"], ky["artifact"]], finish=False)
    assert compile_on(v, variant(pb, 81), pb, timeout=300).cache == pb.REMOTE_HIT
    assert compile_on(v, variant(pb, 82), pb, timeout=300).cache == pb.MISS
    with pytest.raises(grpc.RpcError) as e:  # F's failure, shared (the same toolchain identity)
        compile_on(v, variant(pb, 86), pb, timeout=300)
    assert "shared through the remote tier" in e.value.details()
    h86 = re.search(r"guard hash ([0-9a-f]{64})", e.value.details()).group(1)
    out = v.tcctl("evict", h86, timeout=300)  # the shared failure goes, through the loop
    assert out["evicted"] and out["remote_removed"] == ["failure"]
    rcluster.nodes[1].kill()
    hs = [compile_on(v, variant(pb, rows), pb, timeout=300) for rows in (83, 84, 85)]
    assert all(r.cache == pb.MISS for r in hs)
    assert v.stats()["remote_errors"] >= 1
    for r in hs:  # those on the dead master: evicted here, the Redis error reported
        p = v.tcctl("evict", r.guard_hash, check=False, timeout=300)
        assert json.loads(p.stdout)["evicted"] and (p.returncode == 0) == (not json.loads(p.stdout)["remote_error"])
    rc = v.stop(timeout=180)
    log = vg_log.read_text()
    assert rc == 0, f"valgrind exit {rc}:\n{log[-6000:]}"
    assert "ERROR SUMMARY: 0 errors" in log, log[-6000:]
    assert a.stop() == 0


def test_cluster_failover_to_replica(daemon_factory, tmp_path, pb):
    """A master dies and its replica takes over: the daemon follows the
    promotion (its map refreshed from CLUSTER SLOTS, or a MOVED) without a
    restart, and serves remote hits from the promoted replica. Meanwhile
    the dead master's slots cost only sharing (a local compile), never an
    error to the client."""
    d = tmp_path / "rcluster"
    d.mkdir()
    rc = RedisCluster(str(d), masters=3, replicas=1, node_timeout=1000).start()
    try:
        a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=own_dir(tmp_path, "a"),
                           extra_args=["--redis", rc.url()]).start()
        b = daemon_factory(cache_dir=str(tmp_path / "b"), workdir=own_dir(tmp_path, "b"),
                           extra_args=["--redis", rc.url(rc.nodes[0]), "--redis-timeout-ms", "500"]).start()
        wait_for(lambda: "slot map loaded" in b.read_log(), what="B's slot map")
        victim, replica = rc.nodes[1], rc.replicas[1][0]
        rows = []
        for r in range(100, 160):
            h = compile_on(a, variant(pb, r), pb).guard_hash
            if rc.owner(keys_of(h)["entry"]) is victim:
                rows.append(r)
                if len(rows) == 8:
                    break
        assert len(rows) == 8, "enough guard hashes on the victim's slots"
        wait_for(lambda: a.stats()["remote_stores"] >= 8 and len(rc.keys(victim, "tccd:*:artifact")) == 8,
                 what="write-through")
        assert victim.cmd("WAIT", 1, 5000) == 1, "the replica has the writes"
        assert len(rc.keys(replica, "tccd:*:artifact")) == 8

        assert compile_on(b, variant(pb, rows[0]), pb).cache == pb.REMOTE_HIT
        victim.kill()
        # until the promotion: a local compile, not an error
        r1 = compile_on(b, variant(pb, rows[1]), pb)
        assert r1.cache == pb.MISS
        wait_for(lambda: replica.cmd("ROLE")[0] == b"master", timeout=30, what="the replica's promotion")
        t0 = time.time()
        wait_for(lambda: f"redis 127.0.0.1:{replica.port}: connected" in b.read_log(), timeout=15,
                 what="B following the promotion")
        picked_up = time.time() - t0
        assert picked_up < 4, f"the promotion was followed after {picked_up:.1f} s"
        for r in rows[2:]:
            resp = compile_on(b, variant(pb, r), pb)
            assert resp.cache == pb.REMOTE_HIT, pb.CacheStatus.Name(resp.cache)
        s = b.stats()
        assert s["remote_hits"] == 7 and s["compiles"] == 1 and s["compile_failures"] == 0
        assert s["remote_connected"]
        # writes and evictions reach the promoted replica: A's copy of rows[1]
        # (replicated before the kill) is evicted, B's own written through
        out = b.tcctl("evict", r1.guard_hash)
        assert out["evicted"] and out["remote_removed"] == ["entry", "artifact"] and not out["remote_error"]
        stores = b.stats()["remote_stores"]
        assert compile_on(b, variant(pb, rows[1]), pb).cache == pb.MISS
        wait_for(lambda: b.stats()["remote_stores"] == stores + 1, what="the write-through after the failover")
        assert replica.cmd("EXISTS", keys_of(r1.guard_hash)["artifact"]) == 1
        assert a.stop() == 0 and b.stop() == 0
    finally:
        rc.stop()
