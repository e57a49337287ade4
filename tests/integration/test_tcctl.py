"""
tcctl's operator commands against the real daemon: stats --zero, clear
(its prompt, --yes, what it keeps), jobs, ops, ls --failures, show and
evict of a recorded failure by prefix, ls saying when it cut the list,
one-line usage errors with a hint, per-command help, hits that show the
original compile time, and health's warnings (no auth beyond loopback).
"""
import json
import os
import pty
import shutil
import subprocess
import threading

import pytest

from conftest import GRAPHS, TCCTL, Redis, fake_cc, tcctl, wait_for

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")
DIAGNOSTIC = "kernel.c:1:1: error: expected declaration"


def variant_file(tmp_path, rows):
    """sin_cos.json with `rows` rows (a new guard hash per value)."""
    req = json.load(open(SIN_COS))
    for v in req["graph"]["values"]:
        v["meta"]["sizes"] = [rows, 10]
    p = tmp_path / f"sin_cos_{rows}.json"
    p.write_text(json.dumps(req))
    return str(p)


def switchable_cc(tmp_path):
    """A C compiler that fails with a diagnostic while tmp_path/broken
    exists and sleeps 3 s first while tmp_path/slow exists."""
    broken, slow = tmp_path / "broken", tmp_path / "slow"
    cc = fake_cc(tmp_path, "switch-cc",
                 f'[ -e {slow} ] && sleep 3\n'
                 f'if [ -e {broken} ]; then echo "{DIAGNOSTIC}" >&2; exit 1; fi\n'
                 'exec cc "$@"')
    return cc, broken, slow


def two_entries_one_failure(d, tmp_path, broken):
    """Compiles two graphs, then records a failure for a third."""
    a = d.tcctl("compile", variant_file(tmp_path, 3))
    b = d.tcctl("compile", variant_file(tmp_path, 5))
    broken.touch()
    p = d.tcctl("compile", variant_file(tmp_path, 7), check=False)
    broken.unlink()
    assert p.returncode == 1 and "INTERNAL" in p.stderr, p.stderr
    return a["guard_hash"], b["guard_hash"]


def run_on_terminal(addr, args, answer):
    """tcctl with a pseudo-terminal as stdin, answering the prompt."""
    master, slave = pty.openpty()
    p = subprocess.Popen([TCCTL, "--addr", addr, *args], stdin=slave, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    os.close(slave)
    os.write(master, answer.encode())
    out, err = p.communicate(timeout=60)
    os.close(master)
    return p.returncode, out, err


def test_failures_listed_shown_and_evicted_by_prefix(daemon_factory, tmp_path):
    cc, broken, _ = switchable_cc(tmp_path)
    d = daemon_factory(extra_args=["--cc", cc, "--failure-ttl", "1h"]).start()
    two_entries_one_failure(d, tmp_path, broken)

    ls = d.tcctl("ls", "--failures")
    assert ls["total"] == 1 and not ls["truncated"] and ls["entries"] == []
    f = ls["failures"][0]
    assert f["code"] == "INTERNAL" and DIAGNOSTIC in f["message"] and f["target"].startswith("cpu:")
    assert f["key_size"] > 0 and f["created_unix"] > 0
    h = f["guard_hash"]
    table = d.tcctl("ls", "--failures", json_out=False)
    assert table.splitlines()[0].split() == ["HASH", "TARGET", "CODE", "CREATED", "MESSAGE"]
    row = table.splitlines()[1]
    assert row.startswith(h[:12]) and "INTERNAL" in row and row.endswith("...")  # cut in the table

    # show by a prefix: the failure (entries are searched too)
    s = d.tcctl("show", h[:8])
    assert s["failure"]["guard_hash"] == h and s["failure"]["code"] == "INTERNAL"
    human = d.tcctl("show", h[:8], json_out=False)
    assert "recorded failure     INTERNAL" in human and DIAGNOSTIC in human
    p = d.tcctl("show", "--dot", h[:8], check=False)
    assert p.returncode == 1 and "recorded failure" in p.stderr

    # evict by a prefix removes it; the next call compiles (and succeeds)
    out = d.tcctl("evict", h[:10], json_out=False)
    assert f"evicted {h}" in out
    assert d.stats()["negative_entries"] == 0
    p = d.tcctl("show", h[:8], check=False)
    assert p.returncode == 1 and "no cache entry or recorded failure matches" in p.stderr
    assert d.stop() == 0


def test_clear_and_stats_zero(daemon_factory, tmp_path):
    cc, broken, _ = switchable_cc(tmp_path)
    d = daemon_factory(extra_args=["--cc", cc, "--failure-ttl", "1h"]).start()
    a, _ = two_entries_one_failure(d, tmp_path, broken)
    again = d.tcctl("compile", variant_file(tmp_path, 3))
    assert again["cache"] == "hit"

    # stats --zero answers with the statistics before, then they restart
    before = d.tcctl("stats", "--zero")
    assert before["zeroed"] and before["hits"] == 1 and before["misses"] == 3
    assert before["compiles"] == 2 and before["compile_failures"] == 1 and before["compile_seconds"] > 0
    s = d.stats()
    for k in ("hits", "misses", "compiles", "compile_failures", "requests", "compile_seconds",
              "compile_seconds_saved"):
        assert s[k] == 0, (k, s[k])
    assert s["entries"] == 2 and s["bytes"] == before["bytes"] and s["negative_entries"] == 1
    out = d.tcctl("stats", "--zero", json_out=False)
    assert out.rstrip().endswith("statistics zeroed")
    d.tcctl("compile", variant_file(tmp_path, 3))
    assert d.stats()["hits"] == 1

    # clear: not on a terminal, --yes is needed (a usage error)
    p = tcctl(d.addr, "clear", json_out=False, check=False, input="y\n")
    assert p.returncode == 2 and "--yes" in p.stderr and p.stderr.count("\n") == 2
    assert d.stats()["entries"] == 2
    # on a terminal it asks; anything but y/yes keeps everything
    rc, out, err = run_on_terminal(d.addr, ["clear"], "n\n")
    assert rc == 1 and "remove 2 entries (" in err and ", 1 recorded failures and 0 plans from 127.0.0.1:" in err
    assert "nothing removed" in err and d.stats()["entries"] == 2
    rc, out, err = run_on_terminal(d.addr, ["clear"], "yes\n")
    assert rc == 0, err
    assert out.startswith("removed 2 entries (") and ", 1 recorded failures and 0 plans from" in out
    assert "redis" not in out
    s = d.stats()
    assert s["entries"] == 0 and s["bytes"] == 0 and s["negative_entries"] == 0
    assert s["hits"] == 1  # counters are not cleared

    # --yes --json; gc unchanged afterwards; compiling again is a miss
    assert d.tcctl("compile", variant_file(tmp_path, 3))["cache"] == "miss"
    r = d.tcctl("clear", "--yes")
    assert r["entries"] == 1 and r["bytes"] > 0 and r["failures"] == 0 and r["tuning_records"] == 0
    assert r["remote_enabled"] is False and r["note"] == ""
    g = d.tcctl("gc", "--max-bytes", "0")
    assert g["evicted"] == 0
    assert d.tcctl("compile", variant_file(tmp_path, 3))["cache"] == "miss"
    assert d.stop() == 0
    # zeroed counters stay zeroed across a restart
    d.start()
    s = d.stats()
    assert s["hits"] == 1 and s["misses"] == 2 and s["entries"] == 1
    assert d.stop() == 0


def test_jobs_and_ops(daemon_factory, tmp_path):
    cc, _, slow = switchable_cc(tmp_path)
    d = daemon_factory(extra_args=["--cc", cc]).start()
    assert d.tcctl("jobs") == {"jobs": []}
    assert d.tcctl("jobs", json_out=False) == "no compiles in flight\n"

    slow.touch()
    t = threading.Thread(target=lambda: d.tcctl("compile", SIN_COS))
    t.start()
    try:
        wait_for(lambda: d.tcctl("jobs")["jobs"], what="a job in flight")
        job = d.tcctl("jobs")["jobs"][0]
        assert job["state"] in ("QUEUED", "COMPILING", "STORING") and job["waiters"] == 1
        table = d.tcctl("jobs", json_out=False).splitlines()
        assert table[0].split() == ["HASH", "STATE", "ELAPSED", "WAITERS", "CANDIDATES"]
        assert table[1].startswith(job["guard_hash"][:12]) and " s " in table[1] and table[1].endswith("-")
    finally:
        t.join()
        slow.unlink()

    ops = d.tcctl("ops")
    names = {o["target"]: o for o in ops["ops"]}
    assert names["aten.add.Tensor"]["kind"] == "pointwise" and "Tensor other" in names["aten.add.Tensor"]["schema"]
    assert "FLOAT32" in ops["dtypes"] and ops["compiler"]
    human = d.tcctl("ops", json_out=False)
    assert "dtypes               float32, " in human
    lines = human.splitlines()
    head = next(i for i, l in enumerate(lines) if l.startswith("TARGET"))
    assert lines[head].split() == ["TARGET", "KIND", "SCHEMA"]
    assert any(l.startswith("aten.add.Tensor ") and "pointwise" in l for l in lines[head + 1:])
    assert d.tcctl("ops", "--device", "cuda")["ops"]
    p = d.tcctl("ops", "--device", "tpu", check=False)
    assert p.returncode == 2 and "--device must be cpu or cuda" in p.stderr
    assert d.stop() == 0


def test_ls_says_when_it_cut_the_list(daemon, tmp_path):
    for rows in (3, 5, 7):
        daemon.tcctl("compile", variant_file(tmp_path, rows))
    p = tcctl(daemon.addr, "ls", "--limit", "2", json_out=False, check=False)
    assert p.returncode == 0 and len(p.stdout.splitlines()) == 3
    assert p.stderr == "showing 2 of 3 entries (--limit N for more)\n"
    p = tcctl(daemon.addr, "ls", json_out=False, check=False)
    assert p.returncode == 0 and p.stderr == ""
    j = daemon.tcctl("ls", "--limit", "2")
    assert j["total"] == 3 and j["truncated"] is True and len(j["entries"]) == 2
    j = daemon.tcctl("ls")
    assert j["total"] == 3 and j["truncated"] is False


def test_hit_shows_original_compile_time(daemon):
    miss = daemon.tcctl("compile", SIN_COS)
    assert miss["cache"] == "miss"
    assert miss["timings"]["compile_ms"] > 0 and miss["timings"]["original_compile_ms"] == 0
    hit = daemon.tcctl("compile", SIN_COS)
    assert hit["cache"] == "hit" and hit["timings"]["compile_ms"] == 0
    assert abs(hit["timings"]["original_compile_ms"] - miss["timings"]["compile_ms"]) < 0.01
    out = daemon.tcctl("compile", SIN_COS, json_out=False)
    line = next(l for l in out.splitlines() if l.startswith("timings"))
    assert "compile 0.000 ms (this call)" in line
    assert f"compiled originally in {miss['timings']['compile_ms']:.1f} ms" in line


def test_usage_errors_are_one_line_and_a_hint(daemon):
    p = tcctl(daemon.addr, "ls", "--x", json_out=False, check=False)
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "tcctl: ls: unknown option '--x'\nTry 'tcctl help' (or 'tcctl help ls').\n"
    p = tcctl(daemon.addr, "frobnicate", json_out=False, check=False)
    assert p.returncode == 2 and p.stderr == "tcctl: unknown command 'frobnicate'\nTry 'tcctl help'.\n"

    full = tcctl(daemon.addr, "help", json_out=False)
    assert full.startswith("usage: tcctl") and "  clear [--yes]" in full and "  ops [--device" in full
    ls = tcctl(daemon.addr, "help", "ls", json_out=False)
    assert ls.startswith("  ls [--limit N]") and "--failures" in ls and "show" not in ls
    assert tcctl(daemon.addr, "ls", "--help", json_out=False) == ls
    assert tcctl(daemon.addr, "--help", "ls", json_out=False) == ls
    for cmd in ("health", "stats", "show", "evict", "gc", "compile", "fetch", "keygen", "clear", "jobs",
                "ops", "help"):
        out = tcctl(daemon.addr, "help", cmd, json_out=False)
        assert out.startswith(f"  {cmd}") and out in full, cmd
    p = tcctl(daemon.addr, "help", "nope", json_out=False, check=False)
    assert p.returncode == 2 and p.stderr.startswith("tcctl: unknown command 'nope'\n")


def test_health_warns_without_auth_beyond_loopback(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=["--listen", "0.0.0.0:0"]).start()
    out = d.tcctl("health", json_out=False)
    lines = out.splitlines()
    assert lines[0] == "SERVING"
    assert lines[1].startswith(f"warning: listening on 0.0.0.0:{d.port} without auth (--auth-tokens)")
    j = d.tcctl("health")
    assert j["status"] == "SERVING" and len(j["warnings"]) == 1 and "without auth" in j["warnings"][0]
    assert "without auth" in d.stats()["warnings"][0]
    assert d.stop() == 0

    # with --auth-tokens and no token, Stats is refused: no warnings, still 0
    tokens = tmp_path / "tokens"
    tokens.write_text("admin " + "ab" * 24 + "\n")
    tokens.chmod(0o600)
    d = daemon_factory(cache_dir=str(tmp_path / "c2"), extra_args=["--auth-tokens", str(tokens)]).start()
    p = tcctl(d.addr, "health", json_out=False, check=False)
    assert p.returncode == 0 and p.stdout == "SERVING\n"
    assert d.stop() == 0


def test_health_no_warning_on_loopback(daemon):
    assert daemon.tcctl("health", json_out=False) == "SERVING\n"
    j = daemon.tcctl("health")
    assert j["warnings"] == []
    assert daemon.stats()["warnings"] == []


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_clear_leaves_the_shared_tier(daemon_factory, tmp_path):
    """clear empties this daemon's cache only: with --redis it says so, and
    the entry it removed comes back from the shared tier as a remote hit."""
    rdir = tmp_path / "redis"
    rdir.mkdir()
    redis = Redis(str(rdir)).start()
    try:
        d = daemon_factory(extra_args=["--redis", redis.url]).start()
        first = d.tcctl("compile", variant_file(tmp_path, 4))
        assert first["cache"] == "miss"
        wait_for(lambda: d.stats()["remote_stores"] == 1, what="the entry written through to redis")
        out = d.tcctl("clear", "--yes", json_out=False)
        assert out.startswith("removed 1 entries (") and "note: the shared redis tier was not cleared" in out
        r = d.tcctl("clear", "--yes")  # nothing left locally; the note again, in the JSON
        assert r["entries"] == 0 and "not cleared" in r["note"]
        again = d.tcctl("compile", variant_file(tmp_path, 4))
        assert again["cache"] == "remote_hit" and again["guard_hash"] == first["guard_hash"]
        assert d.stop() == 0
    finally:
        redis.stop()
