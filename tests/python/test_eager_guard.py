"""The eager guard (Config.eager_guard; on in the max-autotune modes): a
partition's kernel is timed against the partition's own ops run eagerly
on the first call's inputs, and a kernel slower than eager gives way.

A slow kernel is made by wrapping Kernel.run with a sleep (the kernel
itself still runs and its answer is used where it is kept); a fast one is
a chain of elementwise ops that eager runs as eight passes over 16 MB and
the kernel as one."""
import logging
import time

import pytest
import torch

import tccd
from tccd import client as C
from tccd.config import Config


def chain(x, y):
    a = torch.relu(x * 1.5 + y)
    b = (a - 0.25) * (y + 2.0)
    return torch.abs(b / 3.0) + a


@pytest.fixture
def slow_kernels(monkeypatch):
    """Every Kernel.run sleeps 20 ms first; returns the list of runs."""
    runs = []
    real = C.Kernel.run

    def slow(self, inputs, check=True):
        runs.append(time.perf_counter())
        time.sleep(0.02)
        return real(self, inputs, check)
    monkeypatch.setattr(C.Kernel, "run", slow)
    return runs


def test_slow_kernel_gives_way_to_eager(daemon, slow_kernels, caplog, fresh_state):
    caplog.set_level(logging.INFO, logger="tccd")
    opt = torch.compile(chain, backend=tccd.backend(eager_guard=True))
    x, y = torch.randn(64, 33), torch.randn(64, 33)
    torch.testing.assert_close(opt(x, y), chain(x, y), rtol=1e-5, atol=1e-6)
    timed = len(slow_kernels)
    assert timed >= 1 + 3, "the guard ran the kernel once untimed and at least 3 times timed"
    for _ in range(3):
        x, y = torch.randn(64, 33), torch.randn(64, 33)
        torch.testing.assert_close(opt(x, y), chain(x, y), rtol=1e-5, atol=1e-6)
    assert len(slow_kernels) == timed, "after losing, the kernel is not run again"
    s = tccd.stats()
    assert s["guard_checks"] == 1 and s["guarded_ops"] == s["compiled_ops"] > 0
    assert s["fallback_ops"] == 0, "a guarded op compiles: it is not a fallback"
    assert s["guard_seconds"] > 0
    assert any("they run eagerly" in r.getMessage() for r in caplog.records if r.name == "tccd")


def test_guard_puts_the_rng_state_back(daemon, slow_kernels, fresh_state):
    """A random partition that loses runs eager's ops on the RNG state the
    call found: the answer is eager's, draw for draw."""
    def f(x):
        return torch.nn.functional.dropout(x * 2.0, p=0.5, training=True) + 1.0

    opt = torch.compile(f, backend=tccd.backend(eager_guard=True))
    x = torch.randn(40, 50)
    torch.manual_seed(fresh_state)
    want = f(x)
    torch.manual_seed(fresh_state)
    got = opt(x)
    assert tccd.stats()["guarded_ops"] > 0
    torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_fast_kernel_is_kept(daemon, fresh_state):
    opt = torch.compile(chain, backend=tccd.backend(eager_guard=True))
    x, y = torch.randn(2048, 2048), torch.randn(2048, 2048)
    torch.testing.assert_close(opt(x, y), chain(x, y), rtol=1e-5, atol=1e-5)
    s = tccd.stats()
    print({k: s[k] for k in ("guard_checks", "guard_seconds", "guarded_ops")})
    assert s["guard_checks"] == 1 and s["guarded_ops"] == 0
    assert s["guard_seconds"] < 5


def test_no_guard_by_default(daemon, slow_kernels, fresh_state):
    opt = torch.compile(chain, backend="tccd")
    x, y = torch.randn(8, 9), torch.randn(8, 9)
    torch.testing.assert_close(opt(x, y), chain(x, y), rtol=1e-5, atol=1e-6)
    s = tccd.stats()
    assert s["guard_checks"] == 0 and s["guarded_ops"] == 0 and len(slow_kernels) == 1


def test_guard_option_follows_mode_and_environment(monkeypatch):
    monkeypatch.delenv("TCCD_EAGER_GUARD", raising=False)
    assert Config.make(mode="max-autotune").eager_guard is True
    assert Config.make(mode="max-autotune-no-cudagraphs").eager_guard is True
    assert Config.make().eager_guard is False
    assert Config.make(mode="max-autotune", eager_guard=False).eager_guard is False
    monkeypatch.setenv("TCCD_EAGER_GUARD", "0")
    assert Config.make(mode="max-autotune").eager_guard is False
    monkeypatch.setenv("TCCD_EAGER_GUARD", "1")
    assert Config.make().eager_guard is True
    monkeypatch.setenv("TCCD_EAGER_GUARD", "yes")
    with pytest.raises(ValueError, match="TCCD_EAGER_GUARD"):
        Config.make()
    monkeypatch.delenv("TCCD_EAGER_GUARD")
    with pytest.raises(ValueError, match="eager_guard"):
        Config.make(eager_guard="on")


def test_race_times_the_kernel_after_its_governor_samples(monkeypatch):
    """A CPU kernel's thread governor runs its calls 3 and 4 on one thread
    (cpu/prelude.c). The guard's race warms the kernel up past them, so
    a kernel that is fast in its steady state is timed fast: here calls 3
    and 4 take 30 ms, every other 1 ms, and eager 6 ms. Four rounds: had
    calls 3 and 4 been timed, the kernel's median would be 15 ms."""
    from tccd import dynamo as D
    monkeypatch.setattr(D, "GUARD_ROUNDS", 4)
    monkeypatch.setattr(D, "GUARD_MIN_ROUNDS", 4)
    calls = []

    def kernel():
        calls.append(len(calls))
        time.sleep(0.03 if len(calls) - 1 in (3, 4) else 0.001)

    kernel_s, eager_s = D._race(kernel, lambda: time.sleep(0.006), warm_a=D.GUARD_KERNEL_WARMUPS)
    assert D.GUARD_KERNEL_WARMUPS >= 5
    assert len(calls) >= D.GUARD_KERNEL_WARMUPS + D.GUARD_MIN_ROUNDS
    assert kernel_s < 0.004 < eager_s, (kernel_s, eager_s)
    assert eager_s * D.GUARD_MARGIN >= kernel_s
