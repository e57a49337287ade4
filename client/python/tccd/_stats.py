"""Process-wide counters behind tccd.stats() and tccd.fallback_ops().

graphs            AOTAutograd graphs handed to tccd (forward, backward, inference)
eager_graphs      of those, graphs run wholly eagerly (CUDA, daemon down with fallback)
ops               ATen ops in those graphs (getitem not counted)
compiled_ops      ops inside partitions that run as tccd kernels
fallback_ops      ops that run eagerly in PyTorch
partitions        compiled partitions
kernels           kernels loaded (one per partition and input signature; a
                  dynamic-shape kernel serves every signature its guards admit)
dynamic_kernels   of those, dynamic-shape kernels (ABI 2)
compile_requests  Compile calls for kernels (trial compiles not included)
trial_compiles    one-node compiles that verified an op (daemons without Compiler.Ops)
cache_miss / cache_hit / cache_coalesced / cache_remote_hit
                  the daemon's CacheStatus of each compile request
compile_seconds   wall time spent in compile + fetch + load
setup_seconds     wall time of graph setup (partitioning + compiles)
aot_save_seconds  wall time of turning graphs into AOTAutogradCache entries
                  (tccd.aot_cache: GraphPickler)
aot_cache_hits    AOTAutograd graphs loaded from torch's AOTAutogradCache
                  instead of traced (tccd.config aot_cache)
aot_recipe_hits   of those, graphs set up from their saved recipe
                  (recipe.py) instead of partitioned again
aot_plan_hits     the same number under its old name (deprecated; removed
                  in 0.2; not the daemon's plans below)
plan_hits         AOTAutograd entries set up from the daemon's plan (plan.py)
                  because this node's AOTAutogradCache had none
plan_misses       local misses for which the daemon had no usable plan
plans_refused     of those, plans this process would not use (logged with why)
plans_sent        plans handed to the daemon (PutPlan)
plan_save_seconds wall time of making and sending plans
plan_load_seconds wall time of getting, checking and decoding plans
guard_checks      signatures the eager guard timed (Config.eager_guard)
guard_seconds     wall time of those timings
guarded_ops       ops of partitions whose kernel lost to eager for some
                  signature and run eagerly for it (not in fallback_ops:
                  they compile, they are just slower)
huge_page_bytes   inference weights' bytes collapsed into 2 MB pages
                  (hugepages.py; Config.huge_pages)
huge_page_failures 2 MB pages the kernel would not collapse then (EAGAIN, ENOMEM)
huge_page_seconds the collapsing thread's time (it runs beside the calls)
"""
import collections
import threading

_lock = threading.Lock()
_ZERO = dict(graphs=0, eager_graphs=0, ops=0, compiled_ops=0, fallback_ops=0, partitions=0,
             kernels=0, dynamic_kernels=0, compile_requests=0, trial_compiles=0, cache_miss=0, cache_hit=0,
             cache_coalesced=0, cache_remote_hit=0, compile_seconds=0.0, setup_seconds=0.0, aot_save_seconds=0.0,
             aot_cache_hits=0, aot_recipe_hits=0, plan_hits=0, plan_misses=0, plans_refused=0,
             plans_sent=0, plan_save_seconds=0.0, plan_load_seconds=0.0,
             guard_checks=0, guard_seconds=0.0, guarded_ops=0, huge_page_bytes=0, huge_page_failures=0,
             huge_page_seconds=0.0)
_counters = dict(_ZERO)
_fallback = collections.Counter()
_graphs = []


def add(**kw):
    with _lock:
        for k, v in kw.items():
            _counters[k] += v


def add_fallback(names):
    """names: {op target: count} of ops that run eagerly."""
    with _lock:
        _fallback.update(names)
        for k in [k for k, v in _fallback.items() if v <= 0]:   # taken back (recipe.py)
            del _fallback[k]


def add_graph(record):
    with _lock:
        _graphs.append(dict(record))


def snapshot():
    with _lock:
        out = dict(_counters)
        out["aot_plan_hits"] = out["aot_recipe_hits"]   # deprecated name, until 0.2
        out["graphs_detail"] = [dict(g) for g in _graphs]
        return out


def fallback_ops():
    with _lock:
        return dict(_fallback)


def reset():
    with _lock:
        _counters.clear()
        _counters.update(_ZERO)
        _fallback.clear()
        _graphs.clear()
