"""Many ranks, one compile: torch.distributed jobs (gloo, CPU) whose ranks
compile with backend="tccd" against one fresh daemon, 2 and 4 ranks:

- DistributedDataParallel around the compiled module (ddp_child.py);
- FSDP2's fully_shard (fsdp_child.py): each block compiled, then
  sharded, or the sharded model compiled.

In each, the daemon compiles each distinct request once (the other ranks'
identical requests are coalesced or hits), every rank sends the same
requests (the same guard hashes: nothing rank-specific reaches the key),
nothing falls back, and the losses and weights match the same job run
eagerly. With FSDP2, each rank has an AOTAutograd cache of its own (a
node of its own) and plans on: the job keeps one plan per entry, so the
ranks' AOTAutograd keys are equal too. (DDP's DDPOptimizer compiles its
bucket graphs with fakify_first_call, which torch's AOTAutogradCache
refuses, so DDP jobs get no entries and no plans.)

Each rank is a process of its own with RANK / WORLD_SIZE / MASTER_ADDR /
MASTER_PORT, as torchrun would start it (rank_common.py); every rank
draws other data, from the test's seed."""
import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import SOURCE, free_port

HERE = os.path.dirname(os.path.abspath(__file__))


def run_job(script, world, seed, **env):
    """Runs tests/python/`script` as the `world` ranks of one job (with
    `env`, "{rank}" in a value replaced by the rank); returns their
    reports, by rank."""
    port = free_port()
    procs = []
    for rank in range(world):
        penv = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port), OMP_NUM_THREADS="1", TCC_DIST_SEED=str(seed),
                    PYTHONPATH=os.pathsep.join([HERE, os.path.join(SOURCE, "client", "python")]),
                    **{k: v.replace("{rank}", str(rank)) for k, v in env.items()})
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, script)], env=penv,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    reports = []
    for p in procs:
        out, err = p.communicate(timeout=600)
        assert p.returncode == 0, err[-4000:]
        reports.append(json.loads(next(l for l in out.splitlines() if l.startswith("REPORT "))[7:]))
    return sorted(reports, key=lambda r: r["rank"])


def check_compiled_once(got, daemon):
    """Every rank sent the same requests and ran every op compiled; the
    daemon compiled each distinct request once, and every other request
    of the job was coalesced with that compile or hit its entry."""
    first, world = got[0], len(got)
    distinct = len(set(first["hashes"]))
    assert first["compile_requests"] > 0 and "forward" in first["kinds"] and "backward" in first["kinds"]
    for r in got:
        # nothing rank-specific in the key: the same guard hashes on every rank
        assert sorted(r["hashes"]) == sorted(first["hashes"]), got
        assert len(r["hashes"]) == r["compile_requests"], r
        assert r["fallback_ops"] == 0, r
        assert r["cache_miss"] + r["cache_hit"] + r["cache_coalesced"] + r["cache_remote_hit"] \
            == r["compile_requests"], r
    assert sum(r["cache_miss"] for r in got) == distinct, got
    assert sum(r["cache_hit"] + r["cache_coalesced"] for r in got) \
        == world * first["compile_requests"] - distinct, got
    s = daemon.stats()
    assert s["compiles"] == distinct and s["entries"] == distinct, s


def check_losses(got, want):
    for g, w in zip(got, want):
        for a, b in zip(g["losses"], w["losses"]):
            assert abs(a - b) <= 1e-5 * abs(b) + 1e-6, (g["losses"], w["losses"])


@pytest.mark.parametrize("world", [2, 4])
def test_ddp_ranks_compile_once_and_match_eager(own_daemon, fresh_state, world):
    daemon = own_daemon()
    got = run_job("ddp_child.py", world, fresh_state, TCC_DDP_EAGER="0")
    want = run_job("ddp_child.py", world, fresh_state, TCC_DDP_EAGER="1")
    print(json.dumps(got, indent=1))
    first = got[0]
    assert first["buckets"] is None or first["buckets"] >= 2, first   # several DDP buckets
    assert first["graphs"] >= 2                                       # forward and backward
    check_compiled_once(got, daemon)
    check_losses(got, want)
    for g, w in zip(got, want):
        # the ranks' weights stay in step (DDP averaged the gradients)
        assert abs(g["weight0"] - w["weight0"]) <= 1e-4 * abs(w["weight0"]) + 1e-4
    assert len({round(r["weight0"], 6) for r in got}) == 1


@pytest.mark.parametrize("form,world", [("layers", 2), ("root", 2), ("layers", 4)])
def test_fsdp2_ranks_compile_once_and_match_eager(own_daemon, fresh_state, tmp_path, form, world):
    daemon = own_daemon()
    # every rank a node of its own (its own AOTAutograd cache), plans on
    got = run_job("fsdp_child.py", world, fresh_state, TCC_FSDP_MODE=form,
                  TCC_FSDP_OUT=str(tmp_path / "tccd.pt"), TCCD_PLANS="1",
                  TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "aot-rank{rank}"))
    want = run_job("fsdp_child.py", world, fresh_state, TCC_FSDP_MODE="eager",
                   TCC_FSDP_OUT=str(tmp_path / "eager.pt"))
    print(json.dumps(got, indent=1))
    assert all(r["sharded"] for r in got + want)
    check_compiled_once(got, daemon)
    # one plan per AOTAutograd entry for the whole job: the ranks' keys are
    # equal (each rank sent a plan, or started from another rank's)
    entries = {r["plans_sent"] + r["plan_hits"] for r in got}
    assert len(entries) == 1 and entries.pop() >= 1 and not any(r["aot_cache_hits"] for r in got), got
    assert daemon.stats()["plans"] == got[0]["plans_sent"] + got[0]["plan_hits"]
    check_losses(got, want)
    # the parameters in full after the steps (the ranks hold shards of one
    # copy): equal to eager's, and moved well beyond the tolerance
    mine, ref = torch.load(tmp_path / "tccd.pt"), torch.load(tmp_path / "eager.pt")
    assert mine["final"].keys() == ref["final"].keys()
    for name, w in ref["final"].items():
        torch.testing.assert_close(mine["initial"][name], ref["initial"][name], rtol=0, atol=0)
        torch.testing.assert_close(mine["final"][name], w, rtol=1e-5, atol=1e-6,
                                   msg=lambda m, name=name: f"{name}: {m}")
        assert (w - ref["initial"][name]).abs().max() > 1e-3, name
