"""
`tcctl evict` with a remote tier, on a real redis-server (one server, and
a 3-master Redis Cluster): the eviction reaches the shared tier too. A
deterministic compile failure recorded in Redis (the shared negative
cache) is gone after `tcctl evict` on one daemon, so a fresh daemon on the
same Redis compiles the graph instead of answering the old error; an
evicted entry is gone cluster-wide (a fresh daemon compiles, no remote
hit); and with Redis down the local eviction still happens and the Redis
error is reported (exit status 1), never hidden.
"""
import shutil
import time

import grpc
import pytest

from conftest import Redis, RedisCluster, compile_on, fake_cc, tcctl, wait_for, sin_cos_variant as variant

pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")


class Tier:
    """The shared tier under test: one redis-server or a Redis Cluster."""

    def __init__(self, kind, workdir):
        self.kind = kind
        if kind == "single":
            self.server = Redis(workdir).start()
            self.nodes = [self.server]
            self.url = self.server.url
        else:
            self.server = RedisCluster(workdir, masters=3).start()
            self.nodes = self.server.nodes
            self.url = self.server.url()

    def owner(self, key):
        return self.server if self.kind == "single" else self.server.owner(key)

    def keys(self, h):
        """The tccd keys of guard hash h, as their parts ("entry", ...)."""
        node = self.owner(f"tccd:{{{h}}}:entry")
        return {k.decode().rsplit(":", 1)[1] for k in node.cmd("KEYS", f"tccd:{{{h}}}:*")}

    def failure_hashes(self):
        out = set()
        for n in self.nodes:
            out |= {k.decode().split("{")[1].split("}")[0] for k in n.cmd("KEYS", "tccd:*:failure")}
        return out

    def kill_owner(self, h):
        """Kills the server (single) or the master owning h's slot."""
        self.owner(f"tccd:{{{h}}}:entry").kill()

    def stop(self):
        self.server.stop()


@pytest.fixture(params=["single", "cluster"])
def tier(request, tmp_path):
    d = tmp_path / "redis"
    d.mkdir()
    t = Tier(request.param, str(d))
    yield t
    t.stop()


def own_dir(tmp_path, name):
    d = tmp_path / f"run-{name}"
    d.mkdir(exist_ok=True)
    return str(d)


def test_evict_clears_the_shared_failure_and_entry(daemon_factory, tier, tmp_path, pb):
    broken = fake_cc(tmp_path, "broken-cc", 'echo "broken-cc: internal compiler error" >&2; exit 1')

    def daemon(name, *extra):
        return daemon_factory(cache_dir=str(tmp_path / name), workdir=own_dir(tmp_path, name),
                              extra_args=["--redis", tier.url, *extra]).start()

    # A's compiler fails deterministically: recorded locally and in Redis
    a = daemon("a", "--cc", broken)
    req = variant(pb, 90)
    with pytest.raises(grpc.RpcError) as e:
        compile_on(a, req, pb)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    wait_for(lambda: len(tier.failure_hashes()) == 1, what="the failure record in redis")
    h = tier.failure_hashes().pop()
    assert tier.keys(h) == {"failure"}
    # a daemon with a working compiler believes the shared record ...
    b0 = daemon("b0")
    with pytest.raises(grpc.RpcError) as e:
        compile_on(b0, req, pb)
    assert "shared through the remote tier" in e.value.details()

    # ... until an operator evicts it on A: locally and in Redis
    out = a.tcctl("evict", h)
    assert out == {"guard_hash": h, "evicted": True, "remote_enabled": True, "remote_removed": ["failure"],
                   "remote_error": ""}
    assert tier.keys(h) == set() and not tier.failure_hashes()
    assert "removed locally; redis: removed" in a.read_log()

    # a fresh daemon on the same Redis compiles instead of answering the old error
    b = daemon("b")
    r = compile_on(b, req, pb)
    assert r.cache == pb.MISS and r.guard_hash == h
    s = b.stats()
    assert s["compiles"] == 1 and s["negative_hits"] == 0 and s["compile_failures"] == 0
    wait_for(lambda: b.stats()["remote_stores"] == 1, what="B's write-through")
    assert tier.keys(h) == {"entry", "artifact"}

    # the entry goes cluster-wide too (human output), and a fresh daemon compiles it
    out = b.tcctl("evict", h[:12], json_out=False)
    assert out == f"evicted {h}\nredis: removed entry, artifact\n"
    assert tier.keys(h) == set()
    c = daemon("c")
    assert compile_on(c, req, pb).cache == pb.MISS and c.stats()["remote_hits"] == 0

    # a hash only Redis holds: evicted there; then nothing anywhere is NOT_FOUND
    wait_for(lambda: tier.keys(h) == {"entry", "artifact"}, what="C's write-through")
    out = a.tcctl("evict", h)
    assert out["evicted"] is False and out["remote_removed"] == ["entry", "artifact"]
    assert tier.keys(h) == set()
    p = a.tcctl("evict", h, check=False)
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr and p.stdout == ""
    for d in (a, b0, b, c):
        assert d.stop() == 0


def test_evict_with_redis_down(daemon_factory, tier, tmp_path, pb):
    a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=own_dir(tmp_path, "a"),
                       extra_args=["--redis", tier.url, "--redis-timeout-ms", "500"]).start()
    h = compile_on(a, variant(pb, 91), pb).guard_hash
    h2 = compile_on(a, variant(pb, 92), pb).guard_hash
    wait_for(lambda: a.stats()["remote_stores"] == 2, what="write-through")
    tier.kill_owner(h)
    t0 = time.time()
    p = a.tcctl("evict", h, check=False)
    assert time.time() - t0 < 10
    assert p.returncode == 1, p.stdout + p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["evicted"] is True and out["remote_enabled"] is True and out["remote_removed"] == []
    assert out["remote_error"] and "redis" in out["remote_error"]
    assert "UNAVAILABLE" in p.stderr and "not removed" in p.stderr
    # the local eviction happened all the same
    assert h not in {e["guard_hash"] for e in a.tcctl("ls")["entries"]}
    assert a.stats()["remote_errors"] >= 1
    # human form: the local result on stdout, the Redis error on stderr
    if tier.kind == "single":
        p = a.tcctl("evict", h2, json_out=False, check=False)
        assert p.returncode == 1 and p.stdout == f"evicted {h2}\n"
        assert "tcctl: evict: UNAVAILABLE: redis" in p.stderr
    assert compile_on(a, variant(pb, 91), pb).cache == pb.MISS
    assert a.stop() == 0
