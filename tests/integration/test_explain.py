"""tcctl explain against the real daemon: why a request missed the cache.

Each test makes stored keys differ from a request in a known way (an input
size, a dtype, the compiler, a target, a recorded failure) and checks that
the explanation names exactly that component, with both values."""
import glob
import json
import os
import sqlite3

import grpc
import pytest
from google.protobuf import json_format

from conftest import compile_on, fake_cc, sin_cos_request, sin_cos_variant, tcctl


def write_request(tmp_path, name, req):
    path = tmp_path / name
    path.write_text(json_format.MessageToJson(req))
    return str(path)


def causes(candidate):
    return {d["component"]: (d["value"], d["other"]) for d in candidate["differences"]}


def test_a_new_batch_size_names_the_input_sizes(daemon, tmp_path, pb):
    first = compile_on(daemon, sin_cos_variant(pb, 8), pb)
    assert first.cache == pb.MISS
    path = write_request(tmp_path, "rows16.json", sin_cos_request(pb, 16))
    ex = tcctl(daemon.addr, "explain", path)
    assert ex["stored"] == ""  # nothing compiled for 16 rows
    assert ex["same_graph"] == 1
    near = ex["nearest"][0]
    assert near["guard_hash"] == first.guard_hash and near["kind"] == "entry"
    assert causes(near) == {"input 0 sizes": ("[16, 10]", "[8, 10]"),
                            "input 1 sizes": ("[16, 10]", "[8, 10]")}
    assert near["causes"] == 2 and near["derived"] >= 1  # the output's sizes follow
    assert "input 0 sizes: [16, 10] vs [8, 10]" in ex["summary"]
    assert 0 < ex["elapsed_ms"] < 10_000

    # Compiled now: explained by guard hash, as the entry it is, nearest first.
    second = compile_on(daemon, sin_cos_variant(pb, 16), pb)
    assert second.cache == pb.MISS and second.guard_hash == ex["guard_hash"]
    compile_on(daemon, sin_cos_variant(pb, 9), pb)
    ex = tcctl(daemon.addr, "explain", second.guard_hash, "--max", "5")
    assert ex["stored"] == "entry" and ex["same_graph"] == 2
    assert [c["causes"] for c in ex["nearest"]] == [2, 2]
    assert {c["guard_hash"] for c in ex["nearest"]} == {first.guard_hash, compile_on(
        daemon, sin_cos_variant(pb, 9), pb).guard_hash}

    # The human form: one line per differing component.
    out = tcctl(daemon.addr, "explain", second.guard_hash[:10], json_out=False)
    assert "input 0 sizes" in out and "[16, 10]" in out and "nearest" in out


def test_dtype_and_new_graph(daemon, tmp_path, pb):
    compile_on(daemon, sin_cos_variant(pb, 8), pb)
    req = sin_cos_request(pb, 8)
    for v in req.graph.values:
        v.meta.dtype = pb.FLOAT64
    ex = tcctl(daemon.addr, "explain", write_request(tmp_path, "f64.json", req))
    assert causes(ex["nearest"][0]) == {"input 0 dtype": ("float64", "float32"),
                                        "input 1 dtype": ("float64", "float32")}
    # softmax shares no structure with sin+cos: said so, nothing listed
    soft = os.path.join(os.environ["TCC_SOURCE_DIR"], "tests", "graphs", "softmax.json")
    ex = tcctl(daemon.addr, "explain", soft)
    assert ex["nearest"] == [] and ex["same_graph"] == 0
    assert "no entry or recorded failure shares the graph" in ex["summary"]


def test_another_compiler_is_named(daemon_factory, tmp_path, cache_dir, pb):
    d = daemon_factory().start()
    old = compile_on(d, sin_cos_variant(pb, 8), pb)
    assert d.stop() == 0
    # The same cache, a C compiler that reports another version: every key
    # changes with the identity, and explain says it is the compiler.
    cc = tmp_path / "newer-cc"
    cc.write_text('#!/bin/sh\ncase "$*" in *--version*) echo "cc (Debian 12.3.0-1) 12.3.0"; exit 0;; esac\n'
                  'exec cc "$@"\n')
    cc.chmod(0o755)
    d = daemon_factory(cache_dir=cache_dir, extra_args=["--cc", str(cc)]).start()
    new = compile_on(d, sin_cos_variant(pb, 8), pb)
    assert new.cache == pb.MISS and new.guard_hash != old.guard_hash
    ex = tcctl(d.addr, "explain", new.guard_hash)
    near = ex["nearest"][0]
    assert near["guard_hash"] == old.guard_hash
    assert list(causes(near)) == ["compiler identity"]
    this, other = causes(near)["compiler identity"]
    assert "12.3.0" in this and "12.3.0" not in other
    assert d.stop() == 0


def test_recorded_failures_and_recent_misses_are_explained(daemon_factory, tmp_path, pb):
    cc = fake_cc(tmp_path, "broken-cc", 'echo "kernel.c:1:1: error: expected declaration" >&2; exit 1')
    d = daemon_factory(extra_args=["--cc", cc]).start()
    with pytest.raises(grpc.RpcError):
        compile_on(d, sin_cos_variant(pb, 8), pb)
    with pytest.raises(grpc.RpcError) as e:
        compile_on(d, sin_cos_variant(pb, 12), pb)
    assert d.stats()["negative_entries"] == 2
    ex = tcctl(d.addr, "explain", write_request(tmp_path, "r12.json", sin_cos_request(pb, 12)))
    assert ex["stored"] == "failure"
    near = ex["nearest"][0]
    assert near["kind"] == "failure" and causes(near)["input 0 sizes"] == ("[12, 10]", "[8, 10]")
    assert "nearest failure" in ex["summary"]
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert d.stop() == 0

    # A transient failure stores nothing, but the miss is kept by hash.
    cc = fake_cc(tmp_path, "killed-cc", "kill -9 $$")
    d = daemon_factory(cache_dir=str(tmp_path / "cache2"), extra_args=["--cc", cc]).start()
    with pytest.raises(grpc.RpcError) as e:
        compile_on(d, sin_cos_variant(pb, 5), pb)
    assert d.stats()["negative_entries"] == 0
    ex = tcctl(d.addr, "explain", write_request(tmp_path, "r5.json", sin_cos_request(pb, 5)))
    assert ex["stored"] == ""
    by_hash = tcctl(d.addr, "explain", ex["guard_hash"])  # the recent miss's key
    assert by_hash["guard_hash"] == ex["guard_hash"] and by_hash["graph_digest"] == ex["graph_digest"]
    unknown = tcctl(d.addr, "explain", "ab" * 32, check=False)
    assert unknown.returncode == 1 and "NOT_FOUND" in unknown.stderr
    assert d.stop() == 0


def test_bad_input_gets_a_clear_error(daemon, tmp_path, pb):
    for arg in ("xyz", "12"):
        p = tcctl(daemon.addr, "explain", arg, check=False)
        assert p.returncode == 1 and "guard hash" in p.stderr, p.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"graph": {"values": [{"name": "x"}], "outputs": ["nope"]}}')
    p = tcctl(daemon.addr, "explain", str(bad), check=False)
    assert p.returncode == 1 and "INVALID_ARGUMENT" in p.stderr
    # both a hash and a request, or neither: refused by the daemon
    with grpc.insecure_channel(daemon.addr) as ch:
        call = ch.unary_unary("/tcc.v1.Cache/Explain", request_serializer=None,
                              response_deserializer=None)
        both = pb.ExplainRequest(guard_hash="ab" * 32, request=sin_cos_request(pb, 3))
        for msg in (both.SerializeToString(), b"", b"\xff\xff\xff"):
            with pytest.raises(grpc.RpcError) as e:
                call(msg, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert tcctl(daemon.addr, "health", json_out=False).strip() == "SERVING"


def test_entries_stored_before_the_graph_column_are_found(daemon_factory, cache_dir, tmp_path, pb):
    """A cache from before schema v5 has no graph digests: the first
    explain fills them in, and finds the old entries."""
    d = daemon_factory().start()
    old = compile_on(d, sin_cos_variant(pb, 8), pb)
    assert d.stop() == 0
    db = sqlite3.connect(os.path.join(cache_dir, "cache.db"))
    db.execute("UPDATE entries SET graph = NULL")
    db.commit()
    db.close()
    d = daemon_factory(cache_dir=cache_dir).start()
    ex = tcctl(d.addr, "explain", write_request(tmp_path, "r4.json", sin_cos_request(pb, 4)))
    assert ex["nearest"][0]["guard_hash"] == old.guard_hash
    assert d.stop() == 0
    db = sqlite3.connect(os.path.join(cache_dir, "cache.db"))
    assert db.execute("SELECT count(*) FROM entries WHERE graph IS NULL").fetchone()[0] == 0
    db.close()


def test_every_graph_of_the_corpus_is_explained(daemon, tmp_path, pb):
    """Every request of tests/graphs, compiled for the daemon's target, then
    explained for another ISA level: the target is named, in under 100 ms
    (the daemon's own figure; printed for the docs)."""
    times = {}
    for path in sorted(glob.glob(os.path.join(os.environ["TCC_SOURCE_DIR"], "tests", "graphs", "*.json"))):
        name = os.path.basename(path)
        got = tcctl(daemon.addr, "compile", path)
        other = "x86-64" if got["target"] != "cpu:x86-64" else "x86-64-v2"
        ex = tcctl(daemon.addr, "explain", "--target", f"cpu:{other}", path)
        assert ex["stored"] == "" and ex["nearest"], name
        near = ex["nearest"][0]
        assert near["guard_hash"] == got["guard_hash"], name
        assert causes(near)["target arch"] == (other, got["target"].split(":", 1)[1]), name
        assert {c["component"].split()[0] for c in near["differences"]} <= {"target", "compiler"}, name
        times[name] = ex["elapsed_ms"]
    print("explain ms per corpus graph:", json.dumps(times), "max", max(times.values()))
    assert len(times) >= 7
