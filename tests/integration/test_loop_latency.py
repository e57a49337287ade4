"""
The loop never stalls (issue 19, item 2): while one client's huge request
is prepared and compiled, and while `tcctl gc` verifies a large cache,
other clients' cache hits and health checks are answered at once.

Before request preparation moved off the loop and canonicalization lost
its quadratic step, a 64k-input `cat` (5 MB) stalled every call for
3.2-3.5 s, and gc over 512 MiB for 6.6 s. The tests here assert a bound
far below those stalls that a loaded CI machine still meets; the figures
against the 5 ms p99 target come from the same code run as a benchmark:

    .venv/bin/python tests/integration/test_loop_latency.py [--gc-mib 512] [--json FILE]
"""
import hashlib
import json
import os
import sqlite3
import sys
import threading
import time

import grpc
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from conftest import Daemon, load_request_json  # noqa: E402


def cat_request(pb, n):
    """n `neg` nodes of one input, all fed to one `cat`: the request whose
    preparation used to be quadratic."""
    r = pb.CompileRequest()
    g = r.graph

    def value(name, sizes):
        v = g.values.add()
        v.name = name
        v.meta.dtype = pb.FLOAT32
        v.meta.sizes.extend(sizes)
        v.meta.strides.extend([1] * len(sizes))
        v.meta.device.type = pb.CPU

    value("x", [1])
    g.inputs.append("x")
    for i in range(n):
        value(f"n{i}", [1])
        nd = g.nodes.add()
        nd.target = "aten.neg.default"
        a = nd.inputs.add()
        a.name = "self"
        a.arg.as_tensor.name = "x"
        nd.outputs.append(f"n{i}")
    value("cat", [n])
    cat = g.nodes.add()
    cat.target = "aten.cat.default"
    a = cat.inputs.add()
    a.name = "tensors"
    for i in range(n):
        a.arg.as_tensors.values.add().name = f"n{i}"
    cat.outputs.append("cat")
    g.outputs.append("cat")
    r.target.device = pb.CPU
    r.target.cpu_isa = "x86-64-v2"
    return r.SerializeToString()


def hit_request(pb):
    from google.protobuf import json_format
    return json_format.ParseDict(load_request_json("sin_cos.json"), pb.CompileRequest()).SerializeToString()


def inflate_cache(cache_dir, mib, blob_mib=1, corrupt=0):
    """Adds `mib` MiB of entries to a (stopped) daemon's cache: copies of
    its one real entry, each with a random artifact of blob_mib MiB, the
    first `corrupt` of them with bytes that do not match their digest."""
    db = sqlite3.connect(os.path.join(cache_dir, "cache.db"))
    row = db.execute("SELECT target, kind, kernels, compile_ms, created, last_used, key, manifest, request_meta "
                     "FROM entries LIMIT 1").fetchone()
    assert row, "the cache needs one real entry to copy"
    for i in range(mib // blob_mib):
        data = os.urandom(blob_mib << 20)
        sha = hashlib.sha256(data).digest()
        if i < corrupt:
            data = data[:-1] + bytes([data[-1] ^ 1])
        db.execute("INSERT INTO blobs(sha256, size, data) VALUES (?, ?, ?)", (sha, len(data), data))
        db.execute("INSERT INTO entries(hash, target, kind, artifact_sha256, size, kernels, compile_ms, created, "
                   "last_used, key, manifest, request_meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                   (os.urandom(32), row[0], row[1], sha, len(data), *row[2:]))
    db.commit()
    db.close()


def sample(addr, hit, seconds, busy):
    """Health checks and cache hits, one after another, for `seconds` or
    until busy() is false (at least 1 s): each one's latency in ms."""
    health_ms, hit_ms = [], []
    with grpc.insecure_channel(addr) as ch:
        comp = ch.unary_unary("/tcc.v1.Compiler/Compile", request_serializer=None, response_deserializer=None)
        health = ch.unary_unary("/grpc.health.v1.Health/Check", request_serializer=None,
                                response_deserializer=None)
        comp(hit, timeout=60)
        t_end, t_min = time.time() + seconds, time.time() + 1.0
        while time.time() < t_end and (busy() or time.time() < t_min):
            t = time.perf_counter()
            health(b"", timeout=30)
            health_ms.append((time.perf_counter() - t) * 1000)
            t = time.perf_counter()
            comp(hit, timeout=30)
            hit_ms.append((time.perf_counter() - t) * 1000)
            time.sleep(0.002)
    return health_ms, hit_ms


def summary(ms):
    s = sorted(ms)
    return {"n": len(s), "p50_ms": s[len(s) // 2], "p99_ms": s[min(len(s) - 1, int(len(s) * 0.99))],
            "max_ms": s[-1]}


def while_running(fn):
    """Starts fn on a thread; returns (is-running predicate, result dict)."""
    out = {}

    def run():
        t0 = time.time()
        try:
            out["result"] = fn()
        except grpc.RpcError as e:
            out["result"] = f"{e.code().name}: {e.details()[:160]}"
        out["seconds"] = time.time() - t0

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th.is_alive, out, th


def measure_big_request(d, pb, n=65535):
    big, hit = cat_request(pb, n), hit_request(pb)

    def send():
        with grpc.insecure_channel(d.addr, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
            ch.unary_unary("/tcc.v1.Compiler/Compile", request_serializer=None,
                           response_deserializer=None)(big, timeout=300)
            return "compiled"

    busy, out, th = while_running(send)
    health_ms, hit_ms = sample(d.addr, hit, 30, busy)
    th.join(300)
    return {"request_bytes": len(big), "inputs": n, "outcome": out.get("result"), "seconds": out.get("seconds"),
            "health": summary(health_ms), "hit": summary(hit_ms)}


def measure_gc(d, pb):
    hit = hit_request(pb)
    busy, out, th = while_running(lambda: d.tcctl("gc", timeout=300))
    health_ms, hit_ms = sample(d.addr, hit, 120, busy)
    th.join(300)
    return {"outcome": out.get("result"), "seconds": out.get("seconds"), "health": summary(health_ms),
            "hit": summary(hit_ms)}


# Bounds for CI (a shared 2-core VM may be busy): far below the stalls
# they guard against (3.2 s and 6.6 s), loose against scheduling noise.
P99_BOUND_MS = 50
MAX_BOUND_MS = 500


def test_big_request_does_not_stall_others(daemon_factory, pb):
    d = daemon_factory(extra_args=["--compile-timeout-ms", "20000"]).start()
    r = measure_big_request(d, pb)
    print(json.dumps(r))
    assert r["outcome"] is not None and "RESOURCE_EXHAUSTED" not in str(r["outcome"])
    for kind in ("health", "hit"):
        assert r[kind]["n"] >= 50, r
        assert r[kind]["p99_ms"] < P99_BOUND_MS and r[kind]["max_ms"] < MAX_BOUND_MS, r
    assert d.stop() == 0


def test_gc_does_not_stall_others(daemon_factory, pb, tmp_path):
    d = daemon_factory().start()
    d.tcctl("compile", os.path.join(os.path.dirname(__file__), "..", "graphs", "sin_cos.json"))
    assert d.stop() == 0
    inflate_cache(d.cache_dir, 256, corrupt=2)
    d.start()
    r = measure_gc(d, pb)
    print(json.dumps(r))
    assert isinstance(r["outcome"], dict) and r["outcome"]["corrupt_removed"] == 2, r
    assert d.stats()["entries"] == 1 + 256 - 2
    for kind in ("health", "hit"):
        assert r[kind]["p99_ms"] < P99_BOUND_MS and r[kind]["max_ms"] < MAX_BOUND_MS, r
    assert d.stop() == 0


def main():
    import argparse
    import platform
    import subprocess
    import tempfile

    from grpc_tools import protoc

    ap = argparse.ArgumentParser(description="loop latency while a huge request and a gc run")
    ap.add_argument("--gc-mib", type=int, default=512)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from conftest import SOURCE
    out = tempfile.mkdtemp(prefix="tccd-loop-")
    assert protoc.main(["protoc", f"-I{SOURCE}/proto", f"--python_out={out}", f"{SOURCE}/proto/tcc/v1/tcc.proto"]) == 0
    sys.path.insert(0, out)
    from tcc.v1 import tcc_pb2 as pb
    d = Daemon(os.path.join(out, "cache"), extra_args=["--compile-timeout-ms", "20000"]).start()
    big = measure_big_request(d, pb)
    d.tcctl("compile", os.path.join(SOURCE, "tests", "graphs", "sin_cos.json"))
    d.stop()
    inflate_cache(d.cache_dir, args.gc_mib)
    d.start()
    gc = measure_gc(d, pb)
    d.stop()
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((l.split(":", 1)[1].strip() for l in cpu.splitlines() if l.startswith("Model name")), "?")
    result = {"machine": {"cpu": model, "nproc": os.cpu_count(), "python": platform.python_version()},
              "big_request": big, "gc": dict(gc, cache_mib=args.gc_mib)}
    print(f"machine: {model}, {os.cpu_count()} cores")
    print(f"{'while':<40} {'health p50':>10} {'p99':>8} {'max':>8} {'hit p50':>8} {'p99':>8} {'max':>8}  (ms)")
    for name, r in ((f"a {big['inputs']}-input cat is prepared ({big['seconds']:.2f} s)", big),
                    (f"gc verifies {args.gc_mib} MiB ({gc['seconds']:.2f} s)", gc)):
        h, k = r["health"], r["hit"]
        print(f"{name:<40} {h['p50_ms']:>10.2f} {h['p99_ms']:>8.2f} {h['max_ms']:>8.2f} "
              f"{k['p50_ms']:>8.2f} {k['p99_ms']:>8.2f} {k['max_ms']:>8.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
