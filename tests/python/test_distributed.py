"""Many ranks, one compile: DistributedDataParallel (gloo, CPU) around a
module compiled with backend="tccd", 2 and 4 ranks against one fresh
daemon. The daemon compiles each distinct graph once (the other ranks'
identical requests are coalesced or hits), every rank's key is the same
(nothing rank-specific reaches the guard hash), nothing falls back, and
the losses and weights match the same job run eagerly.

Each rank is a process of its own (ddp_child.py) with RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT, as torchrun would start it."""
import json
import os
import socket
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(world, eager=False):
    port = free_port()
    procs = []
    for rank in range(world):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port), OMP_NUM_THREADS="1", TCC_DDP_EAGER="1" if eager else "0")
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "ddp_child.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
        reports.append(json.loads(next(l for l in out.splitlines() if l.startswith("REPORT "))[7:]))
    return sorted(reports, key=lambda r: r["rank"])


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_ranks_compile_once_and_match_eager(own_daemon, world):
    own_daemon()
    got = run_job(world)
    want = run_job(world, eager=True)
    first = got[0]
    print(json.dumps(got, indent=1))
    assert first["buckets"] is None or first["buckets"] >= 2, first   # several DDP buckets
    assert first["compile_requests"] > 0 and first["graphs"] >= 2     # forward and backward
    for r in got:
        # the same graphs and requests on every rank: nothing rank-specific in the key
        assert r["compile_requests"] == first["compile_requests"], got
        assert r["fallback_ops"] == 0, r
        assert r["cache_miss"] + r["cache_hit"] + r["cache_coalesced"] + r["cache_remote_hit"] \
            == r["compile_requests"], r
    # one compile per distinct request across the job; every other rank's
    # request was coalesced with it or hit the entry it made
    assert sum(r["cache_miss"] for r in got) == first["compile_requests"], got
    assert sum(r["cache_hit"] + r["cache_coalesced"] for r in got) == (world - 1) * first["compile_requests"]
    for g, w in zip(got, want):
        for a, b in zip(g["losses"], w["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b) + 1e-6, (g["losses"], w["losses"])
        # the ranks' weights stay in step (DDP averaged the gradients)
        assert abs(g["weight0"] - w["weight0"]) <= 1e-4 * abs(w["weight0"]) + 1e-4
    assert len({round(r["weight0"], 6) for r in got}) == 1
