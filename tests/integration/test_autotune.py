"""
max-autotune against the real daemon: candidates are built on the pool and
benchmarked in tccd-bench children; the tuned kernels compute the right
thing (vs NumPy on fresh random inputs); a candidate that crashes, hangs
or computes a wrong answer (TCC_BENCH_FAULT, test-only) is discarded and
logged while the daemon keeps serving; tuning records are reused by
another graph with the same kernel (zero benchmark runs, also after a
restart); CUDA targets are stored untuned (no GPU here).

Shapes are small and --autotune-reps low to keep the suite quick.
"""
import json
import os
import subprocess
import time

import numpy as np
import pytest

from conftest import GRAPHS, TCC_RUN, TCCTL, load_request_json, wait_for

FAST = ["--autotune-reps", "3", "--autotune-timeout-ms", "20000"]


def meta(dtype, sizes):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.insert(0, acc)
        acc *= s
    return {"dtype": dtype, "sizes": list(sizes), "strides": strides, "device": {"type": "CPU"}}


def request(values, inputs, outputs, nodes, mode="MAX_AUTOTUNE"):
    return {"graph": {"values": [{"name": n, "meta": meta("FLOAT32", s)} for n, s in values],
                      "inputs": inputs, "outputs": outputs, "nodes": nodes},
            "target": {"device": "CPU", "cpuIsa": "x86-64-v2"}, "options": {"mode": mode}}


def softmax_node(x, out):
    return {"target": "aten._softmax.default",
            "inputs": [{"name": "self", "arg": {"asTensor": {"name": x}}},
                       {"name": "dim", "arg": {"asInt": -1}},
                       {"name": "half_to_float", "arg": {"asBool": False}}],
            "outputs": [out]}


def unary_node(op, x, out):
    return {"target": f"aten.{op}.default",
            "inputs": [{"name": "self", "arg": {"asTensor": {"name": x}}}], "outputs": [out]}


def softmax_req(rows=64, cols=1000, mode="MAX_AUTOTUNE"):
    return request([("x", [rows, cols]), ("sm", [rows, cols])], ["x"], ["sm"],
                   [softmax_node("x", "sm")], mode)


def softmax_sin_req(order, rows=64, cols=1000):
    """softmax(x) and sin(y): two kernels; `order` lists the outputs."""
    outs = {"sm": ("x", softmax_node("x", "sm")), "s": ("y", unary_node("sin", "y", "s"))}
    values = [("x", [rows, cols]), ("y", [40, 50]), ("sm", [rows, cols]), ("s", [40, 50])]
    return request(values, ["x", "y"], list(order), [outs[o][1] for o in order])


def gelu_mlp_req(b=48, k=64, n=96):
    req = load_request_json("gelu_mlp.json")
    shapes = {"x_1": [b, k], "w_1": [n, k], "b_1": [n], "permute": [k, n], "addmm": [b, n],
              "gelu": [b, n]}
    for v in req["graph"]["values"]:
        m = meta(v["meta"]["dtype"], shapes[v["name"]])
        if v["name"] == "permute":  # a view of w_1: w_1's strides transposed
            m["strides"] = [1, k]
        v["meta"] = m
    req["options"] = {"mode": "MAX_AUTOTUNE_NO_CUDAGRAPHS"}
    return req


def write(tmp_path, name, req):
    p = tmp_path / name
    p.write_text(json.dumps(req))
    return str(p)


def run(addr, path, inputs, out_shapes, tmp_path):
    """tcc-run (libtccclient: compile, fetch, verify, load, run)."""
    in_files = []
    for i, a in enumerate(inputs):
        f = tmp_path / f"in{i}.bin"
        f.write_bytes(np.ascontiguousarray(a, dtype=np.float32).tobytes())
        in_files.append(str(f))
    out_files = [str(tmp_path / f"out{i}.bin") for i in range(len(out_shapes))]
    p = subprocess.run([TCC_RUN, addr, path, *in_files, "--", *out_files], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout), [np.fromfile(f, np.float32).reshape(s) for f, s in zip(out_files, out_shapes)]


def softmax64(x):
    x = x.astype(np.float64)
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def gelu64(x):
    from math import erf
    return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2)))


def seed_rng():
    seed = int(time.time_ns() % 2**32)
    print("seed", seed)
    return seed, np.random.default_rng(seed)


def test_max_autotune_kernels_are_right(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=FAST).start()
    seed, rng = seed_rng()

    x = rng.standard_normal((64, 1000)).astype(np.float32) * 4
    line, (sm,) = run(d.addr, write(tmp_path, "sm.json", softmax_req()), [x], [(64, 1000)], tmp_path)
    assert line["cache"] == "miss"
    np.testing.assert_allclose(sm, softmax64(x), rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")

    xb, w, b = (rng.standard_normal(s).astype(np.float32) for s in ((48, 64), (96, 64), (96,)))
    line, (g,) = run(d.addr, write(tmp_path, "mlp.json", gelu_mlp_req()), [xb, w, b], [(48, 96)], tmp_path)
    ref = gelu64(xb.astype(np.float64) @ w.astype(np.float64).T + b)
    np.testing.assert_allclose(g, ref, rtol=1e-4, atol=1e-4, err_msg=f"seed {seed}")

    pw = request([("x", [33, 70]), ("y", [33, 70])], ["x"], ["y"], [unary_node("tanh", "x", "y")])
    xp = rng.standard_normal((33, 70)).astype(np.float32)
    line, (t,) = run(d.addr, write(tmp_path, "pw.json", pw), [xp], [(33, 70)], tmp_path)
    np.testing.assert_allclose(t, np.tanh(xp.astype(np.float64)), rtol=1e-5, atol=1e-6,
                               err_msg=f"seed {seed}")

    s = d.stats()
    assert s["autotune_runs"] == 3, s
    assert s["autotune_candidates"] >= 3 * 4, "every candidate of every run is benchmarked"
    assert s["autotune_discarded"] == 0
    assert s["tuning_records"] >= 3 and s["autotune_seconds"] > 0
    assert s["compiles"] == 3 and s["autotuning_jobs"] == 0
    # a second request is a plain cache hit: nothing is tuned again
    line, _ = run(d.addr, str(tmp_path / "sm.json"), [x], [(64, 1000)], tmp_path)
    assert line["cache"] == "hit"
    assert d.stats()["autotune_runs"] == 3
    log = d.read_log()
    assert "autotune" in log and "-> candidate" in log
    assert d.stop() == 0


def test_faulty_candidates_are_discarded(daemon_factory, tmp_path):
    """Candidate 1 crashes, 2 hangs (killed at the wall-clock limit), 3
    corrupts its outputs: each is discarded and logged, the daemon keeps
    serving, and the kernel it stores is still right."""
    d = daemon_factory(extra_args=["--autotune-reps", "3", "--autotune-timeout-ms", "1500"],
                       env={"TCC_BENCH_FAULT": "crash=1,hang=2,wrong=3"}).start()
    seed, rng = seed_rng()
    x = rng.standard_normal((64, 1000)).astype(np.float32) * 3
    t0 = time.time()
    line, (sm,) = run(d.addr, write(tmp_path, "sm.json", softmax_req()), [x], [(64, 1000)], tmp_path)
    assert time.time() - t0 < 60
    np.testing.assert_allclose(sm, softmax64(x), rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")
    s = d.stats()
    assert s["autotune_crashed"] == 1 and s["autotune_timeouts"] == 1 and s["autotune_wrong"] == 1, s
    assert s["autotune_discarded"] == 3
    log = d.read_log()
    assert "candidate 1 (" in log and "discarded: crashed" in log
    assert "candidate 2 (" in log and "discarded: timed out" in log
    assert "candidate 3 (" in log and "discarded: wrong output" in log
    # the kernel chosen is never a discarded candidate
    chosen = [l for l in log.splitlines() if "-> candidate" in l]
    assert chosen and not any(f"-> candidate {c} " in l for l in chosen for c in (1, 2, 3)), chosen
    # still serving: health, and another graph compiles (and is tuned)
    assert d.tcctl("health", json_out=False, check=False).returncode == 0
    xt = rng.standard_normal((20, 30)).astype(np.float32)
    pw = request([("x", [20, 30]), ("y", [20, 30])], ["x"], ["y"], [unary_node("sigmoid", "x", "y")])
    line, (y,) = run(d.addr, write(tmp_path, "pw.json", pw), [xt], [(20, 30)], tmp_path)
    np.testing.assert_allclose(y, 1 / (1 + np.exp(-xt.astype(np.float64))), rtol=1e-5, atol=1e-6)
    assert d.stats()["autotune_runs"] == 2
    assert d.stop() == 0


def test_old_bench_exe_name_is_still_read(daemon_factory, tmp_path):
    """TCCD_BENCH_EXE, TCC_BENCH_EXE's documented name before the naming
    rule, is read until 0.2, with a warning. Here it names no program: no
    candidate is measured, and the default kernel is served, right."""
    missing = str(tmp_path / "no-such-tccd-bench")
    d = daemon_factory(extra_args=FAST, env={"TCCD_BENCH_EXE": missing}).start()
    xt = np.linspace(-3, 3, 20 * 30, dtype=np.float32).reshape(20, 30)
    pw = request([("x", [20, 30]), ("y", [20, 30])], ["x"], ["y"], [unary_node("tanh", "x", "y")])
    line, (y,) = run(d.addr, write(tmp_path, "pw.json", pw), [xt], [(20, 30)], tmp_path)
    np.testing.assert_allclose(y, np.tanh(xt.astype(np.float64)), rtol=1e-5, atol=1e-6)
    log = d.read_log()
    assert log.count("TCCD_BENCH_EXE is deprecated") == 1, log
    assert f"cannot run '{missing}'" in log and "-> candidate" not in log, log
    assert d.stop() == 0


def test_tuning_records_are_reused(daemon_factory, tmp_path):
    """Graph A = (softmax(x), sin(y)); graph B lists the same outputs the
    other way round: a different guard hash, the same two kernels. B is
    tuned from A's records without a single benchmark, also after a
    restart."""
    d = daemon_factory(extra_args=FAST).start()
    a = d.tcctl("compile", write(tmp_path, "a.json", softmax_sin_req(["sm", "s"])))
    assert a["cache"] == "miss" and a["kernels"] == 2
    s = d.stats()
    assert s["autotune_runs"] == 1 and s["tuning_records"] == 2
    benched = s["autotune_candidates"]
    assert d.stop() == 0
    d.start()
    b_path = write(tmp_path, "b.json", softmax_sin_req(["s", "sm"]))
    b = d.tcctl("compile", b_path)
    assert b["cache"] == "miss" and b["guard_hash"] != a["guard_hash"]
    s = d.stats()
    assert s["autotune_candidates"] == benched, "no candidate benchmarked for known kernels"
    assert s["autotune_runs"] == 1 and s["autotune_record_hits"] == 2
    # and B is right
    seed, rng = seed_rng()
    y = rng.standard_normal((40, 50)).astype(np.float32)
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    line, (sn, sm) = run(d.addr, b_path, [x, y], [(40, 50), (64, 1000)], tmp_path)
    assert line["cache"] == "hit"
    np.testing.assert_allclose(sn, np.sin(y.astype(np.float64)), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sm, softmax64(x), rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")
    assert d.stop() == 0


def test_default_mode_is_not_tuned_and_json_has_no_progress(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=FAST).start()
    p = subprocess.run([TCCTL, "--addr", d.addr, "--json", "compile",
                        write(tmp_path, "d.json", softmax_req(mode="DEFAULT"))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["cache"] == "miss" and p.stderr == ""
    assert d.stats()["autotune_runs"] == 0
    p = subprocess.run([TCCTL, "--addr", d.addr, "--json", "compile",
                        write(tmp_path, "t.json", softmax_req(rows=8, cols=300))],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["cache"] == "miss"
    assert p.stderr == "", "--json prints no progress"
    s = d.stats()
    assert s["autotune_runs"] == 1
    text = d.tcctl("stats", json_out=False)
    for label in ("autotune runs", "autotune time", "tuning records", "discarded"):
        assert label in text
    assert d.stop() == 0


def test_cuda_target_is_stored_untuned(daemon_factory, tmp_path):
    d = daemon_factory(extra_args=FAST).start()
    req = softmax_req(rows=8, cols=100)
    p = d.tcctl("compile", write(tmp_path, "c.json", req), "--target", "cuda:sm_80", check=False)
    if p.returncode != 0 and "NVRTC" in p.stderr:
        d.stop()
        pytest.skip("NVRTC not available (scripts/setup-cuda)")
    assert p.returncode == 0, p.stderr
    s = d.stats()
    assert s["autotune_untuned"] == 1 and s["autotune_runs"] == 0 and s["autotune_candidates"] == 0
    assert "untuned" in d.read_log()
    assert d.stop() == 0


def run_on_pty(args):
    """Runs tcctl with stderr on a pseudo-terminal; returns (rc, stdout, stderr text)."""
    import pty
    import select
    master, slave = pty.openpty()
    p = subprocess.Popen([TCCTL, *args], stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    err = b""
    while True:
        r, _, _ = select.select([master], [], [], 0.2)
        if r:
            try:
                chunk = os.read(master, 4096)
            except OSError:
                chunk = b""
            if not chunk and p.poll() is not None:
                break
            err += chunk
        elif p.poll() is not None:
            break
    out = p.stdout.read().decode()
    p.wait(120)
    os.close(master)
    return p.returncode, out, err.decode(errors="replace")


def test_compile_progress_line_on_a_terminal(daemon_factory, tmp_path):
    """`tcctl compile` on a terminal shows the job's state and the
    candidates benchmarked on one rewritten stderr line (tcc.v1.Compiler/
    Jobs), erased at the end; --json shows nothing even on a terminal."""
    d = daemon_factory(extra_args=["--autotune-reps", "40"]).start()
    rc, out, err = run_on_pty(["--addr", d.addr, "compile",
                               write(tmp_path, "a.json", softmax_req(rows=256, cols=1000))])
    assert rc == 0, err
    assert "guard hash" in out
    assert "\r\x1b[Ktccd: " in err and "AUTOTUNING" in err, repr(err)
    assert "candidates " in err and "benchmarked" in err
    assert err.endswith("\r\x1b[K"), "the line is erased when the compile returns"
    rc, out, err = run_on_pty(["--addr", d.addr, "--json", "compile",
                               write(tmp_path, "b.json", softmax_req(rows=255, cols=1000))])
    assert rc == 0 and json.loads(out)["cache"] == "miss"
    assert err == "", repr(err)
    jobs = subprocess.run([TCCTL, "--addr", d.addr, "--json", "stats"], capture_output=True, text=True)
    assert json.loads(jobs.stdout)["autotuning_jobs"] == 0
    assert d.stop() == 0


RECORD_HEAD = 4 + 1 + 16 + 64  # remote.c's record envelope: "TCR1", signed?, key id, signature


@pytest.fixture
def redis(tmp_path):
    import shutil
    from conftest import Redis
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server not installed")
    d = tmp_path / "redis"
    d.mkdir()
    r = Redis(str(d)).start()
    yield r
    r.stop()


def tune_keys(r):
    return sorted(k.decode() for k in r.cmd("KEYS", "tccd:{*}:rec:tune"))


def check_b(d, b_path, tmp_path):
    """Graph B on daemon d computes the right thing."""
    seed, rng = seed_rng()
    y = rng.standard_normal((40, 50)).astype(np.float32)
    x = rng.standard_normal((64, 1000)).astype(np.float32) * 3
    line, (sn, sm) = run(d.addr, b_path, [x, y], [(40, 50), (64, 1000)], tmp_path)
    np.testing.assert_allclose(sn, np.sin(y.astype(np.float64)), rtol=1e-5, atol=1e-6, err_msg=f"seed {seed}")
    np.testing.assert_allclose(sm, softmax64(x), rtol=1e-5, atol=1e-7, err_msg=f"seed {seed}")


def test_tuning_records_are_shared_through_redis(daemon_factory, redis, tmp_path):
    """Daemon A tunes graph A and writes its two tuning records through to
    Redis; daemon B (its own cache, the same Redis) compiles graph B (the
    same kernels, another guard hash) without a single benchmark. Records
    altered in Redis are refused (signature) and C benchmarks instead;
    an unsigned daemon refuses records that do not decode or name a
    config it would never generate."""
    args = FAST + ["--redis", redis.url]

    def wd(name):  # each daemon its own log
        p = tmp_path / ("run-" + name)
        p.mkdir()
        return str(p)

    a = daemon_factory(cache_dir=str(tmp_path / "a"), workdir=wd("a"), extra_args=args).start()
    ra = a.tcctl("compile", write(tmp_path, "a.json", softmax_sin_req(["sm", "s"])))
    assert ra["cache"] == "miss" and ra["kernels"] == 2
    wait_for(lambda: len(tune_keys(redis)) == 2, what="two tuning records in Redis")
    keys = tune_keys(redis)

    b_path = write(tmp_path, "b.json", softmax_sin_req(["s", "sm"]))
    b = daemon_factory(cache_dir=str(tmp_path / "b"), workdir=wd("b"), extra_args=args).start()
    rb = b.tcctl("compile", b_path)
    assert rb["cache"] == "miss" and rb["guard_hash"] != ra["guard_hash"]
    s = b.stats()
    assert s["autotune_runs"] == 0 and s["autotune_candidates"] == 0, "no benchmark on B"
    assert s["autotune_record_hits"] == 2 and s["autotune_remote_record_hits"] == 2, s
    assert s["tuning_records"] == 2, "the records are stored locally too"
    check_b(b, b_path, tmp_path)

    def forget_b():  # graph B's entry leaves Redis: the next daemon compiles (and tunes) it
        for part in ("entry", "artifact", "lock"):
            redis.cmd("DEL", f"tccd:{{{rb['guard_hash']}}}:{part}")

    forget_b()
    # altered records: one byte of each blob flipped -> the signature fails
    for k in keys:
        v = bytearray(redis.cmd("GET", k))
        v[-1] ^= 0x01
        assert redis.cmd("SET", k, bytes(v)) == "OK"
    c = daemon_factory(cache_dir=str(tmp_path / "c"), workdir=wd("c"), extra_args=args).start()
    rc = c.tcctl("compile", b_path)
    assert rc["cache"] == "miss"
    s = c.stats()
    assert s["autotune_remote_record_hits"] == 0 and s["autotune_record_hits"] == 0
    assert s["remote_rejected"] >= 2 and s["autotune_runs"] == 1 and s["autotune_candidates"] > 0, s
    assert "refused the record tune/" in c.read_log()
    check_b(c, b_path, tmp_path)

    # an unsigned daemon takes unsigned records, but still validates them
    forged = [b"not a tuning record",
              b"tccd-tune/1 par=1 thr=999 chunk=0 unroll=0 blas=0 vec=0 order=0;best_ns=1;default_ns=2;tried=1;discarded=0"]
    forget_b()
    for k, blob in zip(keys, forged):
        assert redis.cmd("SET", k, b"TCR1" + bytes(RECORD_HEAD - 4) + blob) == "OK"
    d = daemon_factory(cache_dir=str(tmp_path / "d"), workdir=wd("d"), signing_key=None,
                       extra_args=args + ["--redis-trust-unsigned"]).start()
    rd = d.tcctl("compile", b_path)
    assert rd["cache"] == "miss"
    s = d.stats()
    assert s["autotune_remote_record_hits"] == 0 and s["remote_rejected"] == 2, s
    assert s["autotune_runs"] == 1 and s["autotune_candidates"] > 0
    log = d.read_log()
    assert log.count("tuning record from the cluster") == 2, log
    assert "not a tccd-tune/1 record" in log and "not one of this daemon's candidates" in log
    check_b(d, b_path, tmp_path)
    for x in (a, b, c, d):
        assert x.stop() == 0
