"""
`tcctl warm` against the real daemon (issue 22 item 3): the graphs a
daemon holds, compiled again for another target from the requests its
entries keep (cache schema 6), so that a later request for that target
is a hit. Covered: CPU ISA levels and, where NVRTC is built in, CUDA
archs with no GPU; --from-target, --since and --limit; entries that keep
no request; a warmed entry keeps its own request (warmable again);
failures reported (exit 1, last error) and never hiding the rest; jobs'
requests go ahead of a warm run (low priority) and Jobs names the run;
bad targets are clear errors; progress by id, forgotten at a restart.
"""
import json
import os
import sqlite3
import subprocess
import threading
import time

import pytest

from conftest import GRAPHS, fake_cc, tcctl, wait_for

EXAMPLES = sorted(f for f in os.listdir(GRAPHS) if f.endswith(".json"))


def graph_as(tmp_path, name, target):
    """tests/graphs/NAME with its request's target set to `target` (a
    spec) and, for CUDA, its values on the CUDA device."""
    req = json.load(open(os.path.join(GRAPHS, name)))
    kind, _, rest = target.partition(":")
    if kind == "cuda":
        req["target"] = {"device": "CUDA", "cudaArch": rest}
    else:
        req["target"] = {"device": "CPU", "cpuIsa": rest}
    for v in req["graph"]["values"]:
        if "device" in v.get("meta", {}):
            v["meta"]["device"]["type"] = "CUDA" if kind == "cuda" else "CPU"
    p = tmp_path / f"{target.replace(':', '_')}-{name}"
    p.write_text(json.dumps(req))
    return str(p)


def fill(d, tmp_path, target="cpu:x86-64-v2", names=EXAMPLES):
    """Compiles the example graphs for target: {name: guard hash}."""
    out = {}
    for n in names:
        r = d.tcctl("compile", graph_as(tmp_path, n, target))
        assert r["cache"] == "miss", (n, r)
        out[n] = r["guard_hash"]
    return out


def warm(d, *args, check=True):
    return d.tcctl("warm", *args, check=check)


def test_warm_cpu_isa_then_hits(daemon_factory, tmp_path):
    d = daemon_factory().start()
    names = EXAMPLES[:4]
    src = fill(d, tmp_path, "cpu:x86-64-v2", names)
    before = d.stats()

    r = warm(d, "--target", "cpu:x86-64-v3")
    assert r["done"] and r["target"] == "cpu:x86-64-v3"
    assert (r["total"], r["compiled"], r.get("present", 0), r.get("failed", 0)) == (len(names), len(names), 0, 0), r
    after = d.stats()
    assert after["entries"] == before["entries"] + len(names)
    assert after.get("misses", 0) == before.get("misses", 0), "a warm compile is not a miss"

    for n in names:  # a job on the new machine type: hits
        h = d.tcctl("compile", graph_as(tmp_path, n, "cpu:x86-64-v3"))
        assert h["cache"] == "hit", (n, h)
        assert h["guard_hash"] != src[n]

    # again: everything present, nothing compiled
    r2 = warm(d, "--target", "cpu:x86-64-v3", "--from-target", "cpu:x86-64-v2")
    assert (r2["compiled"], r2["present"], r2["total"]) == (0, len(names), len(names)), r2
    assert r2["warm_id"] == r["warm_id"] + 1

    # a warmed entry keeps its own request: v3 -> v4 works from it
    r3 = warm(d, "--target", "cpu:x86-64-v4", "--from-target", "cpu:x86-64-v3")
    assert (r3["total"], r3["compiled"]) == (len(names), len(names)), r3
    h = d.tcctl("compile", graph_as(tmp_path, names[0], "cpu:x86-64-v4"))
    assert h["cache"] == "hit"

    # the human form
    p = d.tcctl("warm", "--target", "cpu:x86-64-v2", "--from-target", "cpu:x86-64-v4", json_out=False)
    assert f"{len(names)}/{len(names)}: 0 compiled, {len(names)} already present, 0 failed" in p and "done" in p


def test_warm_filters_and_entries_without_request(daemon_factory, tmp_path):
    d = daemon_factory().start()
    src = fill(d, tmp_path, "cpu:x86-64-v2", EXAMPLES[:5])
    hashes = list(src.values())
    db = sqlite3.connect(os.path.join(d.cache_dir, "cache.db"), timeout=30)
    with db:  # two entries are two days old, one keeps no request (as if stored before schema 6)
        for h in hashes[:2]:
            db.execute("UPDATE entries SET created = created - 2 * 86400 WHERE hash = ?", (bytes.fromhex(h),))
        db.execute("UPDATE entries SET request = NULL WHERE hash = ?", (bytes.fromhex(hashes[2]),))
    db.close()

    r = warm(d, "--target", "cpu:x86-64-v3", "--since", "1d", "--no-wait")
    assert r["total"] == 2 and r["without_request"] == 1, r  # hashes 3, 4; 2 keeps none
    wait_for(lambda: warm(d, "--id", str(r["warm_id"]), "--no-wait").get("done"), what="warm run end")
    r = warm(d, "--id", str(r["warm_id"]))
    assert r["compiled"] == 2
    for h, name in ((hashes[3], EXAMPLES[3]), (hashes[4], EXAMPLES[4])):
        assert d.tcctl("compile", graph_as(tmp_path, name, "cpu:x86-64-v3"))["cache"] == "hit"

    r = warm(d, "--target", "cpu:x86-64-v4", "--limit", "1")
    assert (r["total"], r["compiled"]) == (1, 1), r
    p = d.tcctl("warm", "--target", "cpu:x86-64-v4", "--since", "1d", json_out=False, check=False)
    assert p.returncode == 0 and "note: 1 matching entries keep no request" in p.stderr, p.stderr


def test_warm_failures_are_reported(daemon_factory, tmp_path):
    broken = tmp_path / "broken"
    cc = fake_cc(tmp_path, "switch-cc",
                 f'if [ -e {broken} ]; then echo "kernel.c:1:1: error: expected declaration (injected)" >&2; exit 1; fi\nexec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc, "--failure-ttl", "1h"]).start()
    fill(d, tmp_path, "cpu:x86-64-v2", EXAMPLES[:3])
    broken.touch()
    p = d.tcctl("warm", "--target", "cpu:x86-64-v3", json_out=False, check=False)
    assert p.returncode == 1, p.stdout + p.stderr
    assert "3/3: 0 compiled, 0 already present, 3 failed" in p.stdout
    assert "last failure:" in p.stdout and "injected" in p.stdout
    broken.unlink()
    # recorded (deterministic): answered again without compiling; the v2 entries are intact
    r = warm(d, "--target", "cpu:x86-64-v3", check=False)
    assert r.returncode == 1 and '"failed": 3' in r.stdout and "recorded failure" in r.stdout
    assert d.stats()["entries"] == 3
    r = warm(d, "--target", "cpu:x86-64-v4")
    assert r["compiled"] == 3


def test_warm_gives_way_to_jobs(daemon_factory, tmp_path):
    slow = tmp_path / "slow"
    cc = fake_cc(tmp_path, "slow-cc", f'[ -e {slow} ] && sleep 1.5\nexec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc, "--workers", "1"]).start()
    fill(d, tmp_path, "cpu:x86-64-v2", EXAMPLES[:6])
    slow.touch()
    r = warm(d, "--target", "cpu:x86-64-v3", "--no-wait")
    run = r["warm_id"]
    wait_for(lambda: any(j.get("warm_id") == run for j in d.tcctl("jobs").get("jobs", [])),
             what="a job of the warm run")
    # a job's request on the busy daemon: compiled after at most the one
    # warm compile in flight, long before the run's end
    done = d.tcctl("compile", graph_as(tmp_path, EXAMPLES[0], "cpu:x86-64-v4"))
    assert done["cache"] == "miss"
    mid = warm(d, "--id", str(run), "--no-wait")
    assert not mid.get("done") and mid.get("compiled", 0) + mid.get("present", 0) <= 3, mid
    end = warm(d, "--id", str(run))
    assert end["done"] and end["compiled"] == 6, end


def test_warm_cuda_without_a_gpu(daemon_factory, tmp_path):
    d = daemon_factory().start()
    names = [n for n in EXAMPLES if n != "pointwise_chain_f64.json"][:3]
    fill(d, tmp_path, "cpu:x86-64-v2", names)
    r = warm(d, "--target", "cuda:sm_90", check=False)
    if r.returncode != 0 and "NVRTC not available" in r.stdout + r.stderr:
        pytest.skip("this build has no NVRTC (scripts/setup-cuda)")
    r = json.loads(r.stdout)
    assert r["compiled"] == len(names), r
    for n in names:
        h = d.tcctl("compile", graph_as(tmp_path, n, "cuda:sm_90"))
        assert h["cache"] == "hit", (n, h)
        assert h["target"] == "cuda:sm_90"


def test_warm_errors_and_restart(daemon_factory, tmp_path):
    d = daemon_factory().start()
    fill(d, tmp_path, "cpu:x86-64-v2", EXAMPLES[:1])
    for args, status, text in (
            (["--target", "cpu:x86-64-v9"], "INVALID_ARGUMENT", "target: unknown cpu_isa 'x86-64-v9'"),
            (["--target", "cuda:sm_9"], "INVALID_ARGUMENT", "bad cuda_arch 'sm_9'"),
            (["--target", "cpu:x86-64-v3", "--from-target", "cpu:x86-64-v3"], "INVALID_ARGUMENT", "both"),
            (["--id", "99"], "NOT_FOUND", "no warm run 99")):
        p = d.tcctl("warm", *args, json_out=False, check=False)
        assert p.returncode == 1 and f": {status}: " in p.stderr and text in p.stderr, p.stderr
    for args, text in ((["--target", "gpu"], "--target must be"), ([], "warm needs --target"),
                       (["--target", "cpu", "--id", "1"], "--id follows a run"),
                       (["--target", "cpu", "--since", "soon"], "--since needs a duration")):
        p = d.tcctl("warm", *args, json_out=False, check=False)
        assert p.returncode == 2 and text in p.stderr, p.stderr
    r = warm(d, "--target", "cpu:x86-64-v3")
    assert d.stop() == 0
    d.start()
    p = d.tcctl("warm", "--id", str(r["warm_id"]), json_out=False, check=False)
    assert p.returncode == 1 and "NOT_FOUND" in p.stderr
    assert d.tcctl("compile", graph_as(tmp_path, EXAMPLES[0], "cpu:x86-64-v3"))["cache"] == "hit"
