"""
Crash consistency: tccd is killed with SIGKILL at random moments while
compiles are being stored. After each kill the SQLite file passes
integrity_check, every entry whose Compile reply reached a client before
the kill is still served (as a hit) after a restart, and the counters
persisted with the entries never fall behind them (compiles >= entries).
"""
import json
import os
import random
import sqlite3
import threading
import time

import grpc

from conftest import sin_cos_request as variant

COMPILE = "/tcc.v1.Compiler/Compile"


def test_kill9_keeps_every_acknowledged_entry(daemon_factory, pb):
    seed = int(time.time_ns() % 2**32)
    rnd = random.Random(seed)
    d = daemon_factory(extra_args=["--workers", "2"]).start()
    acked = {}  # guard hash -> rows
    next_rows = iter(range(1, 100000))
    lock = threading.Lock()

    for round_no in range(6):
        stop = threading.Event()

        def client():
            with grpc.insecure_channel(d.addr) as ch:
                call = ch.unary_unary(COMPILE, request_serializer=None, response_deserializer=None)
                while not stop.is_set():
                    with lock:
                        rows = next(next_rows)
                    try:
                        raw = call(variant(pb, rows).SerializeToString(), timeout=30)
                    except grpc.RpcError:
                        return  # the daemon died mid-call: not acknowledged
                    resp = pb.CompileResponse.FromString(raw)
                    with lock:
                        acked[resp.guard_hash] = rows

        threads = [threading.Thread(target=client) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(rnd.uniform(0.3, 1.5))
        d.kill9()
        stop.set()
        for t in threads:
            t.join(60)

        db = os.path.join(d.cache_dir, "cache.db")
        con = sqlite3.connect(db)
        assert con.execute("PRAGMA integrity_check").fetchone()[0] == "ok", f"round {round_no}, seed {seed}"
        con.close()
        d.start()
        # counters are stored with the entries: every entry was a compile
        s = d.stats()
        assert s["compiles"] >= s["entries"] and s["misses"] >= s["entries"], (round_no, seed, s)

    assert len(acked) >= 6, f"too few compiles acknowledged to test anything ({len(acked)})"
    for h, rows in acked.items():
        resp = pb.CompileResponse.FromString(
            grpc.insecure_channel(d.addr).unary_unary(COMPILE, request_serializer=None,
                                                      response_deserializer=None)(
                variant(pb, rows).SerializeToString(), timeout=60))
        assert resp.guard_hash == h
        assert resp.cache == pb.HIT, f"acknowledged entry {h} (rows={rows}) lost; seed {seed}"
    assert d.stats()["entries"] >= len(acked)
    assert d.stop() == 0
