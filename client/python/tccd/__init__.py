"""tccd — the PyTorch side of the tccd kernel-compilation daemon.

    import torch
    model = torch.compile(model, backend="tccd")        # registered by entry point
    model = torch.compile(model, backend=tccd.backend(mode="max-autotune", fallback="eager"))

The daemon's address comes from $TCCD_ADDR (default 127.0.0.1:7311). See
tccd.backend for the pipeline and tccd.config for every option.

    tccd.stats()          counters (graphs, compiled/fallback ops, kernels, cache statuses)
    tccd.fallback_ops()   {ATen op: count} of ops that ran eagerly
    tccd.Client           the libtccclient binding (compile, fetch, load, run)
    tccd.prewarm(model, example_inputs, targets=["cuda:sm_90", "cpu:x86-64-v4"])
                          compile a model's graphs for targets this process lacks
"""
from ._stats import fallback_ops as _fallback_ops
from ._stats import reset as _reset
from ._stats import snapshot as _snapshot
from .dynamo import Backend, backend, tccd_backend
from .client import Client, Kernel, default_addr
from .config import Config
from .targets import prewarm
from .errors import (TccdCompileError, TccdDeadlineExceeded, TccdError, TccdFallbackWarning,
                     TccdKernelError, TccdLibraryError, TccdUnavailable, TccdUnsupported)

__version__ = "0.1.0"

__all__ = [
    "Backend", "Client", "Config", "Kernel", "TccdCompileError", "TccdDeadlineExceeded",
    "TccdError", "TccdFallbackWarning", "TccdKernelError", "TccdLibraryError",
    "TccdUnavailable", "TccdUnsupported", "backend", "default_addr", "fallback_ops",
    "prewarm", "reset_stats", "stats", "tccd_backend",
]


def stats():
    """Process-wide counters (see tccd._stats); "graphs_detail" lists one
    record per graph: kind, ops, compiled_ops, fallback_ops, partitions,
    and why ops fell back."""
    return _snapshot()


def fallback_ops():
    """{ATen op target: count} of ops that ran eagerly, over all graphs."""
    return _fallback_ops()


def reset_stats():
    """Zeroes stats() and fallback_ops()."""
    _reset()
