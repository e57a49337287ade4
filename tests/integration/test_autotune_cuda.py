"""
max-autotune for CUDA targets against the real daemon, with the recording
fake libcuda (tests/cuda/fake_libcuda.c; TCC_CUDA_LIBRARY) standing in
for a GPU in the benchmark children: its clock advances by a programmed
time per launch (TCC_FAKE_CUDA_LAUNCH_US, by kernel name and block size), so
the test decides which candidate is fastest and checks that the served
artifact's launch geometry is that candidate's; candidates that crash,
hang, fail to launch (TCC_FAKE_CUDA_LAUNCH_FAIL) or compute a wrong answer
(TCC_BENCH_FAULT, test-only) are discarded and counted like CPU ones;
the tuning record is reused with zero benchmarks; and a daemon whose
driver has no device, or only one of another arch, stores the entry
untuned. NVRTC builds the real cubins (skipped without it); nothing runs
on a GPU here (tests/cuda/test_tune_gpu.c does, on a GPU machine).
"""
import json
import os

import pytest

from conftest import BUILD
from test_autotune import FAST, gelu_mlp_req, softmax_req, write

FAKE_CUDA = os.path.join(BUILD, "tests", "cuda", "libfakecuda.so")
FAKE_CUBLAS = os.path.join(BUILD, "tests", "cuda", "libfakecublas.so")


def fake_gpu(nparams=3, **extra):
    """Environment of a daemon whose benchmark children see one fake sm_90
    GPU; nparams = inputs + outputs + 1 of the graphs it will compile (the
    fake checks every kernel's parameter count)."""
    env = {"TCC_CUDA_LIBRARY": FAKE_CUDA, "TCC_CUBLAS_LIBRARY": FAKE_CUBLAS,
           "TCC_FAKE_CUDA_CC": "90", "TCC_FAKE_CUDA_NPARAMS": str(nparams)}
    env.update(extra)
    return env


def compile_cuda(d, tmp_path, name, req, arch="sm_90"):
    p = d.tcctl("compile", write(tmp_path, name, req), "--target", f"cuda:{arch}", check=False)
    if p.returncode != 0 and "NVRTC" in p.stderr:
        d.stop()
        pytest.skip("NVRTC not available (scripts/setup-cuda)")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def blocks(r):
    """{kernel name: block size} of a compile's manifest (launch steps only)."""
    return {k["name"]: k["block"][0] for k in r["manifest"]["kernels"] if k.get("block")}


def test_fastest_candidate_is_served_and_its_record_reused(daemon_factory, tmp_path):
    # softmax [64, 1000]: one reduction kernel k0; 256 threads by default.
    # Launches of k0 with 512-thread blocks take 5 us, any other 40 us.
    cache = str(tmp_path / "cache")
    d = daemon_factory(cache_dir=cache, extra_args=FAST,
                       env=fake_gpu(TCC_FAKE_CUDA_LAUNCH_US="k0@b512=5,k0=40")).start()
    plain = compile_cuda(d, tmp_path, "plain.json", softmax_req(mode="DEFAULT"))
    assert blocks(plain) == {"k0": 256}, "default mode keeps the heuristic"
    r = compile_cuda(d, tmp_path, "t.json", softmax_req())
    assert r["cache"] == "miss"
    assert blocks(r) == {"k0": 512}, r["manifest"]["kernels"]
    s = d.stats()
    assert s["autotune_runs"] == 1 and s["autotune_untuned"] == 0, s
    assert s["autotune_candidates"] == 12 and s["autotune_discarded"] == 0, s
    assert s["tuning_records"] == 1
    log = d.read_log()
    assert "k0 (reduction) -> candidate 2 (" in log and "block=512" in log
    assert "5000 ns vs default 40000 ns" in log

    # The same kernel again (another mode: another cache entry) under
    # timings that now favour 128 threads: the record decides, nothing is
    # benchmarked, also after a restart.
    assert d.stop() == 0
    d = daemon_factory(cache_dir=cache, extra_args=FAST,
                       env=fake_gpu(TCC_FAKE_CUDA_LAUNCH_US="k0@b128=1,k0=40")).start()
    r2 = compile_cuda(d, tmp_path, "t2.json", softmax_req(mode="MAX_AUTOTUNE_NO_CUDAGRAPHS"))
    assert r2["cache"] == "miss" and r2["guard_hash"] != r["guard_hash"]
    assert blocks(r2) == {"k0": 512}
    s = d.stats()
    assert s["autotune_runs"] == 1 and s["autotune_candidates"] == 12, "(counters persist) nothing benchmarked"
    assert s["autotune_record_hits"] == 1, s
    assert d.stop() == 0


def test_failing_candidates_are_discarded(daemon_factory, tmp_path):
    # 512 threads would win (candidates 2 and 5), 128 (candidate 1) next;
    # candidate 2 crashes, 5 computes a wrong answer, 6 hangs (killed at
    # --autotune-timeout-ms), and every launch with 1024 threads
    # (candidate 3) fails: candidate 1 wins.
    env = fake_gpu(TCC_FAKE_CUDA_LAUNCH_US="k0@b512=5,k0@b128=20,k0=40",
                   TCC_FAKE_CUDA_LAUNCH_FAIL="k0@b1024", TCC_BENCH_FAULT="crash=2,wrong=5,hang=6")
    d = daemon_factory(extra_args=["--autotune-reps", "3", "--autotune-timeout-ms", "3000"], env=env).start()
    r = compile_cuda(d, tmp_path, "t.json", softmax_req())
    assert blocks(r) == {"k0": 128}, r["manifest"]["kernels"]
    s = d.stats()
    assert s["autotune_runs"] == 1
    assert s["autotune_crashed"] == 2 and s["autotune_wrong"] == 1 and s["autotune_timeouts"] == 1, s
    assert s["autotune_discarded"] == 4 and s["autotune_candidates"] == 12, s
    log = d.read_log()
    assert "candidate 2 (" in log and "discarded: crashed" in log
    assert "candidate 3 (" in log and "cuLaunchKernel" in log
    assert "candidate 5 (" in log and "discarded: wrong output" in log
    assert "candidate 6 (" in log and "discarded: timed out" in log
    assert "k0 (reduction) -> candidate 1 (" in log
    assert d.tcctl("health", json_out=False).strip() != ""
    assert d.stop() == 0


def test_cublas_steps_are_measured_and_kept(daemon_factory, tmp_path):
    # gelu(x @ w.T + b): a cuBLAS step (k0) then a pointwise epilogue (k1);
    # pointwise launches with 128 threads are fastest.
    d = daemon_factory(extra_args=FAST,
                       env=fake_gpu(nparams=5, TCC_FAKE_CUDA_LAUNCH_US="k1@b128=2,*=30")).start()
    r = compile_cuda(d, tmp_path, "mlp.json", gelu_mlp_req())
    kinds = [k["kind"] for k in r["manifest"]["kernels"]]
    assert kinds[0] == "extern" and "gemm" in r["manifest"]["kernels"][0]
    assert blocks(r) == {"k1": 128}, r["manifest"]["kernels"]
    s = d.stats()
    assert s["autotune_runs"] == 1 and s["autotune_discarded"] == 0 and s["tuning_records"] == 2, s
    assert "k0 (extern) -> candidate 0 (" in d.read_log()
    assert d.stop() == 0


@pytest.mark.parametrize("env,why", [
    ({"TCC_FAKE_CUDA_INIT_ERROR": "100"}, "no GPU on this daemon: "),
    ({"TCC_FAKE_CUDA_CC": "80"}, "runs sm_90 natively (device 0 is sm_80)")])
def test_no_usable_gpu_is_untuned(daemon_factory, tmp_path, env, why):
    d = daemon_factory(extra_args=FAST, env=fake_gpu(**env)).start()
    r = compile_cuda(d, tmp_path, "t.json", softmax_req())
    assert blocks(r) == {"k0": 256}
    s = d.stats()
    assert s["autotune_untuned"] == 1 and s["autotune_runs"] == 0 and s["autotune_candidates"] == 0, s
    log = d.read_log()
    assert why in log and "(untuned)" in log
    assert d.stop() == 0
