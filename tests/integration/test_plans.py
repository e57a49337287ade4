"""
Plans (PutPlan/GetPlan, docs/design.md "Plans"): the daemon keeps a plan
only when every kernel it names is one the daemon compiled, encodes it
canonically (client labels and unknown fields dropped), signs it in
tcc_sign.h's plan layout (checked here with libsodium directly) and keeps
the first one per key. A plan altered in the store is refused (DATA_LOSS)
and removed; a client with trusted keys refuses unsigned or untrusted
plans (PERMISSION_DENIED). Two daemons share plans through Redis
(REMOTE_HIT), and records forged into Redis (unsigned, signed by an
untrusted key, naming another key) are refused. Clear empties the store;
Stats counts it all.
"""
import base64
import ctypes
import hashlib
import os
import re
import shutil
import sqlite3

import grpc
import pytest

from conftest import keygen, sin_cos_request, wait_for
from test_cluster import redis  # noqa: F401 (the fixture: a redis-server of the test's own)
from tccd._proto import tcc_pb2 as tpb
from tccd.client import Client
from tccd.errors import TccdError

GET_PLAN = "/tcc.v1.Cache/GetPlan"
RECORD_HEAD = 4 + 1 + 16 + 64  # remote.c's record envelope: "TCR1", signed?, key id, signature

# ------------------------------------------------------------------ helpers


def compiled(client, rows, label="rank3"):
    """A sin/cos CompileRequest the daemon behind client has compiled."""
    req = sin_cos_request(tpb, rows)
    req.client = label
    client.compile(req)
    return req


def plan_for(key, *requests, fmt=1, forward=True, torch_version="2.13.0+cpu"):
    plan = tpb.Plan(format=fmt, key=key, torch_version=torch_version, package="0123456789abcdef")
    plan.result.object.type = "ViewAndMutationMeta"
    if forward:
        plan.forward.kind = "forward"
        plan.forward.source.nodes.add(op="placeholder", name="x", value=tpb.PlanValue(integer=3))
        part = plan.forward.partitions.add(name="tccd_part_0", ops=2, has_kernel=True)
        for r in requests:
            k = part.kernels.add(outputs=1)
            k.signature.none = True
            k.request.CopyFrom(r)
    return plan


def as_stored(plan):
    """What the daemon keeps of plan: every kernel request's client label cleared."""
    p = tpb.Plan()
    p.CopyFrom(plan)
    for part in (p.forward, p.backward):
        for pp in part.partitions:
            for k in pp.kernels:
                k.request.client = ""
    return p


def raw_get(addr, key):
    """GetPlan without libtccclient: the GetPlanResponse (signature included)."""
    with grpc.insecure_channel(addr) as ch:
        raw = ch.unary_unary(GET_PLAN, request_serializer=None, response_deserializer=None)(
            tpb.GetPlanRequest(key=key).SerializeToString(), timeout=60)
    return tpb.GetPlanResponse.FromString(raw)


def status_of(fn, *args):
    with pytest.raises(TccdError) as e:
        fn(*args)
    return e.value.status, e.value.message


def stat(d, name):
    return d.stats().get(name, 0)


class Ed25519:
    """libsodium through ctypes: the key files of tcctl keygen, and
    tcc_sign.h's signed layout, written out independently of tccd."""

    lib = ctypes.CDLL("libsodium.so.23")

    def __init__(self, secret_path=None):
        seed = base64.b64decode(open(secret_path).read().split()[1]) if secret_path else os.urandom(32)
        self.pk, self.sk = ctypes.create_string_buffer(32), ctypes.create_string_buffer(64)
        assert self.lib.sodium_init() >= 0
        assert self.lib.crypto_sign_seed_keypair(self.pk, self.sk, seed) == 0
        self.key_id = hashlib.sha256(self.pk.raw).hexdigest()[:16]

    @staticmethod
    def message(guard, digest, manifest):
        return b"tccd-artifact-v1\0" + guard + digest + hashlib.sha256(manifest).digest()

    def sign(self, msg):
        sig = ctypes.create_string_buffer(64)
        assert self.lib.crypto_sign_detached(sig, None, msg, ctypes.c_ulonglong(len(msg)), self.sk) == 0
        return sig.raw

    @classmethod
    def verify(cls, pk, sig, msg):
        return cls.lib.crypto_sign_verify_detached(sig, msg, ctypes.c_ulonglong(len(msg)), pk) == 0

    @staticmethod
    def plan_message(key, plan):
        """What a plan's signature covers (tcc_sign.h)."""
        return Ed25519.message(hashlib.sha256(b"tccd-plan-v1\0" + key.encode()).digest(),
                               hashlib.sha256(plan).digest(), b"tccd-plan-v1")

    def record(self, kind, tag, blob):
        """remote.c's record envelope, signed by this key."""
        name = hashlib.sha256(b"tccd-record-v1\0" + kind.encode() + b"\0" + tag.encode()).digest()
        sig = self.sign(self.message(name, hashlib.sha256(blob).digest(), b"tccd-record-v1"))
        return b"TCR1\x01" + self.key_id.encode() + sig + blob


def public_key(pub_path):
    return base64.b64decode(open(pub_path).read().split()[1])


def plan_record_key(key):
    return f"tccd:{{{hashlib.sha256(key.encode()).hexdigest()}}}:rec:plan"


# ------------------------------------------------------------------ tests


def test_put_get_first_writer_wins(daemon_factory, signing_key, monkeypatch):
    monkeypatch.setenv("TCCD_TRUSTED_KEYS", signing_key + ".pub")
    d = daemon_factory().start()
    c = Client(d.addr)
    req = compiled(c, 10)
    assert c.get_plan("tccd.k1") is None
    plan = plan_for("tccd.k1", req)
    # an unknown field (127, varint) rides along: the daemon drops it
    assert c.put_plan(tpb.Plan.FromString(plan.SerializeToString() + b"\xf8\x07\x01")) is True
    got, status = c.get_plan("tccd.k1")
    assert status == tpb.HIT
    assert got == as_stored(plan).SerializeToString()
    assert tpb.Plan.FromString(got).forward.partitions[0].kernels[0].request.client == ""

    # signed in tcc_sign.h's plan layout, by the daemon's key
    r = raw_get(d.addr, "tccd.k1")
    assert r.plan == got and r.cache == tpb.HIT and len(r.signature) == 64
    assert r.key_id == Ed25519(signing_key).key_id
    pk = public_key(signing_key + ".pub")
    assert Ed25519.verify(pk, r.signature, Ed25519.plan_message("tccd.k1", got))
    assert not Ed25519.verify(pk, r.signature, Ed25519.plan_message("tccd.k2", got))

    # the first writer wins: another plan for the key is not kept
    other = plan_for("tccd.k1", req, torch_version="2.14.0")
    assert c.put_plan(tpb.PutPlanRequest(plan=other)) is False
    assert c.get_plan("tccd.k1")[0] == got
    # a second kernel, and a second key
    req2 = compiled(c, 12)
    assert c.put_plan(plan_for("tccd.k2", req, req2)) is True

    # a large plan (a 3 MiB constant): prepared and verified off the loop thread
    big = plan_for("tccd.big", req)
    big.forward.source.constants.add(name="w", value=tpb.PlanValue(tensor=tpb.PlanTensor(
        dtype="float32", sizes=[786432], strides=[1], data=os.urandom(3 << 20))))
    assert c.put_plan(big) is True
    assert c.get_plan("tccd.big") == (as_stored(big).SerializeToString(), tpb.HIT)

    s = d.stats()
    assert s["plans"] == 3 and s["plans_stored"] == 3
    assert s["plan_hits"] == 4 and s["plan_misses"] == 1
    assert s["plan_bytes"] == len(got) + len(c.get_plan("tccd.k2")[0]) + len(as_stored(big).SerializeToString())
    human = d.tcctl("stats", json_out=False)
    assert re.search(r"plans\s+3 \(", human) and re.search(r"plan gets\s+5 hits, 1 misses", human), human

    # Clear empties the store
    cleared = d.tcctl("clear", "--yes")
    assert cleared["plans"] == 3
    assert c.get_plan("tccd.k1") is None
    assert stat(d, "plans") == 0 and stat(d, "plan_bytes") == 0
    c.close()
    assert d.stop() == 0


def test_put_refusals(daemon_factory):
    d = daemon_factory().start()
    c = Client(d.addr)
    req = compiled(c, 10)
    uncompiled = sin_cos_request(tpb, 11)

    st, msg = status_of(c.put_plan, plan_for("tccd.k", req, uncompiled))
    assert st == "FAILED_PRECONDITION", msg
    m = re.search(r"plan names a kernel this daemon has not compiled \(guard ([0-9a-f]{12})\)", msg)
    assert m, msg
    assert c.compile(uncompiled).guard_hash.startswith(m.group(1))
    assert c.put_plan(plan_for("tccd.k", req, uncompiled)) is True  # now it has

    def invalid(plan, what):
        st, msg = status_of(c.put_plan, plan)
        assert st == "INVALID_ARGUMENT" and what in msg, (st, msg)

    for key in ("", "a b", "k/1", "x" * 201, "é"):
        invalid(plan_for(key, req), "plan key must be 1-200 characters")
    invalid(plan_for("tccd.f", req, fmt=2), "plan format 2 is not supported")
    invalid(plan_for("tccd.f", req, forward=False), "plan has no forward graph")
    invalid(plan_for("tccd.f", req, torch_version=""), "torch_version must be 1-200 characters")
    no_request = plan_for("tccd.f", req)
    no_request.forward.partitions[0].kernels.add(outputs=1)
    invalid(no_request, "plan forward partition 0 kernel 1 has no request")
    bad_graph = plan_for("tccd.f", req)
    bad_graph.forward.partitions[0].kernels[0].request.graph.nodes.add(target="aten.nope.default")
    st, msg = status_of(c.put_plan, bad_graph)
    assert st in ("INVALID_ARGUMENT", "UNIMPLEMENTED") and "plan forward partition 0 kernel 0: " in msg, msg
    st, msg = status_of(c.put_plan, tpb.PutPlanRequest())
    assert st == "INVALID_ARGUMENT" and "no plan" in msg, msg
    # a plan key at the limit is fine
    assert c.put_plan(plan_for("k" * 200, req)) is True
    s = d.stats()
    assert s["plans"] == 2 and s["plans_stored"] == 2
    st, msg = status_of(c.get_plan, "bad key")
    assert st == "INVALID_ARGUMENT", msg
    c.close()
    assert d.stop() == 0


def test_tampered_and_untrusted_plans(daemon_factory, signing_key, tmp_path, monkeypatch):
    monkeypatch.setenv("TCCD_TRUSTED_KEYS", signing_key + ".pub")
    d = daemon_factory(cache_dir=str(tmp_path / "a")).start()
    c = Client(d.addr)
    req = compiled(c, 10)
    assert c.put_plan(plan_for("tccd.t", req))
    # another plan under the key, its digest made to match: only the signature can tell
    forged = as_stored(plan_for("tccd.t", req, torch_version="9.9")).SerializeToString()
    db = sqlite3.connect(str(tmp_path / "a" / "cache.db"), timeout=30)
    db.execute("UPDATE plans SET plan = ?, plan_sha256 = ? WHERE key = 'tccd.t'",
               (forged, hashlib.sha256(forged).digest()))
    db.commit()
    db.close()
    st, msg = status_of(c.get_plan, "tccd.t")
    assert st == "DATA_LOSS" and "fails verification" in msg, msg
    assert c.get_plan("tccd.t") is None, "removed"
    assert "plan tccd.t fails verification" in d.read_log()
    assert c.put_plan(plan_for("tccd.t", req)) is True, "a new writer may store it again"
    c.close()

    # an unsigned daemon: a client with trusted keys refuses its plans
    u = daemon_factory(cache_dir=str(tmp_path / "u"), signing_key=None).start()
    cu = Client(u.addr)
    assert cu.put_plan(plan_for("tccd.u", compiled(cu, 10)))
    assert raw_get(u.addr, "tccd.u").signature == b""
    st, msg = status_of(cu.get_plan, "tccd.u")
    assert st == "PERMISSION_DENIED" and "unsigned" in msg, msg
    cu.close()
    monkeypatch.delenv("TCCD_TRUSTED_KEYS")
    with Client(u.addr) as plain:  # no trusted keys: taken as it is
        assert plain.get_plan("tccd.u")[1] == tpb.HIT

    # a daemon signing with a key the client does not trust
    other = keygen(tmp_path / "other.key")
    o = daemon_factory(cache_dir=str(tmp_path / "o"), signing_key=other).start()
    monkeypatch.setenv("TCCD_TRUSTED_KEYS", signing_key + ".pub")
    co = Client(o.addr)
    assert co.put_plan(plan_for("tccd.o", compiled(co, 10)))
    st, msg = status_of(co.get_plan, "tccd.o")
    assert st == "PERMISSION_DENIED" and "not trusted" in msg, msg
    co.close()
    for x in (d, u, o):
        assert x.stop() == 0


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_plans_through_redis(daemon_factory, redis, signing_key, tmp_path, monkeypatch):
    monkeypatch.setenv("TCCD_TRUSTED_KEYS", signing_key + ".pub")

    def start(name, **kw):
        wd = tmp_path / ("run-" + name)
        wd.mkdir()
        return daemon_factory(cache_dir=str(tmp_path / name), workdir=str(wd),
                              extra_args=["--redis", redis.url] + kw.pop("extra", []), **kw).start()

    a, b = start("a"), start("b")
    ca, cb = Client(a.addr), Client(b.addr)
    assert ca.put_plan(plan_for("tccd.shared", compiled(ca, 10)))
    wait_for(lambda: redis.cmd("EXISTS", plan_record_key("tccd.shared")) == 1, what="the plan in redis")
    mine, _ = ca.get_plan("tccd.shared")
    got, status = cb.get_plan("tccd.shared")  # verified by libtccclient (trusted keys)
    assert status == tpb.REMOTE_HIT and got == mine
    r = raw_get(b.addr, "tccd.shared")
    assert r.cache == tpb.HIT, "stored locally on the remote hit"
    assert Ed25519.verify(public_key(signing_key + ".pub"), r.signature, Ed25519.plan_message("tccd.shared", got))
    s = b.stats()
    assert s["plans"] == 1 and s["plan_hits"] == 2 and s.get("plans_stored", 0) == 0

    # forged records, straight into Redis
    trusted, stranger = Ed25519(signing_key), Ed25519()
    key = "tccd.forged"
    tag = hashlib.sha256(key.encode()).hexdigest()
    plan = as_stored(plan_for(key)).SerializeToString()

    def remote_plan(signer, name=key, fmt=1):
        sig = signer.sign(Ed25519.plan_message(name, plan)) if signer else b""
        return tpb.RemotePlan(format=fmt, key=name, plan=plan, signature=sig,
                              key_id=signer.key_id if signer else "").SerializeToString()

    forgeries = {
        "unsigned record": b"TCR1\x00" + bytes(RECORD_HEAD - 5) + remote_plan(None),
        "record signed by an untrusted key": stranger.record("plan", tag, remote_plan(stranger)),
        "plan signed by an untrusted key": trusted.record("plan", tag, remote_plan(stranger)),
        "unsigned plan": trusted.record("plan", tag, remote_plan(None)),
        "plan of another key": trusted.record("plan", tag, remote_plan(trusted, name="tccd.other")),
        "format 2": trusted.record("plan", tag, remote_plan(trusted, fmt=2)),
        "not a RemotePlan": trusted.record("plan", tag, b"\xff\xff\xff"),
    }
    rejected = stat(b, "remote_rejected")
    for what, value in forgeries.items():
        assert redis.cmd("SET", plan_record_key(key), value) == "OK"
        assert cb.get_plan(key) is None, what
        rejected += 1
        assert stat(b, "remote_rejected") == rejected, what
    log = b.read_log()
    assert "refused the record plan/" in log and "remote plan for key tccd.forged refused" in log
    assert stat(b, "plans") == 1

    # the control: the same forging, signed right, is taken
    assert redis.cmd("SET", plan_record_key(key), trusted.record("plan", tag, remote_plan(trusted))) == "OK"
    assert cb.get_plan(key) == (plan, tpb.REMOTE_HIT)

    # a daemon that trusts Redis unsigned (--no-signing --redis-trust-unsigned) still checks key and format
    monkeypatch.delenv("TCCD_TRUSTED_KEYS")
    u = start("u", signing_key=None, extra=["--redis-trust-unsigned"])
    cu = Client(u.addr)
    for fmt, name in ((2, key), (1, "tccd.other")):
        redis.cmd("SET", plan_record_key(key), b"TCR1\x00" + bytes(RECORD_HEAD - 5) + tpb.RemotePlan(
            format=fmt, key=name, plan=plan).SerializeToString())
        assert cu.get_plan(key) is None
    redis.cmd("SET", plan_record_key(key), b"TCR1\x00" + bytes(RECORD_HEAD - 5) + remote_plan(None))
    assert cu.get_plan(key) == (plan, tpb.REMOTE_HIT)
    for x in (ca, cb, cu):
        x.close()
    for x in (a, b, u):
        assert x.stop() == 0
