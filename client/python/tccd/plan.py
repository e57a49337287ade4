"""A graph's partitioning, saved next to its AOTAutograd entry.

A process that loads a graph from the AOTAutograd cache (aot_cache.py)
would still unpickle its fake-tensor graph (GraphPickler: about 0.1 s a
graph on ResNet) and partition it again (verdicts, fusion, output plans:
as long again) before asking the daemon for kernels it already holds.
When a CPU graph has set up and run its first call (partitions that
compile lazily -- dynamic shapes -- have their kernels by then), what it
made is saved as a plan:

  forward     the partitioned graph's Python code (FX's codegen of the
              top level: placeholders, partition calls, getitems, the
              ATen ops that run eagerly -- none that mutates -- and
              get_attr constants) and the globals that code names
  partitions  per partition: name, op count, baked constants, the
              OutputPlan's steps, and per input signature the
              CompileRequest that made its kernel and its seed count
              (key None: the partition's dynamic-shape kernel, for every
              size its guards admit)
  record      the graph's stats record

The next hit on the same entry (same AOTAutograd key, same kind of graph)
runs from the plan (dynamo._CompiledGraph._setup_from_plan): the requests
go to the daemon in parallel (cache hits, verified and loaded as always)
and the code runs with the PlannedPartitions as `self`; no fake tensors,
no fx graph. Whatever the plan did not foresee -- inputs laid out as it
never saw, a view that does not fit, a request the daemon refuses --
raises OffPlan (or fails setup), and the graph is loaded from the entry
and partitioned as before.

A plan also records a hash of this package's sources (package_hash): one
written by other code (another tccd: another encoding of the requests,
another partitioner) is ignored, and the graph partitions and saves anew.

Plans live in <torch's cache dir>/tccd/plans/<key>-<kind>.plan: the same
trust as the AOTAutograd entries beside them (pickles too). Kernels never
come from a plan, only from the daemon, signed and verified.
"""
import functools
import hashlib
import importlib
import logging
import os
import pickle
import tempfile
import types

log = logging.getLogger("tccd")

PLAN_VERSION = 1          # bump when what a plan holds changes


class OffPlan(Exception):
    """A planned graph met something its plan has no answer for."""


@functools.lru_cache(maxsize=None)
def package_hash():
    """sha256 over this package's Python sources (names and bytes)."""
    root = os.path.dirname(os.path.abspath(__file__))
    h = hashlib.sha256()
    for dirpath, dirnames, filenames in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(filenames):
            if name.endswith(".py"):
                path = os.path.join(dirpath, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def path_for(key, kind):
    """Where the plan of graph `kind` of AOTAutograd entry `key` lives."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "tccd", "plans", f"{key}-{kind}.plan")


def forward_source(gm):
    """(source, globals) of gm's forward as FX generates it; modules among
    the globals are kept by name (they do not pickle)."""
    code = gm.graph.python_code(root_module="self")
    names = {}
    for name, value in code.globals.items():
        if isinstance(value, types.ModuleType):
            names[name] = ("module", value.__name__)
        else:
            names[name] = ("value", value)
    return code.src, names


def make_forward(source, names, owner, filename):
    """The forward function of `source` bound to `owner` (its `self`)."""
    env = {}
    for name, (how, value) in names.items():
        env[name] = importlib.import_module(value) if how == "module" else value
    exec(compile(source, filename, "exec"), env)
    return types.MethodType(env["forward"], owner)


def save(path, plan):
    """Writes `plan` (a dict) to `path` atomically. Returns whether it did;
    a plan that does not pickle or a cache dir that is not writable only
    costs the next process its shortcut."""
    try:
        data = pickle.dumps(dict(plan, version=PLAN_VERSION, package=package_hash()),
                            protocol=pickle.HIGHEST_PROTOCOL)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".plan-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return True
    except Exception as e:              # noqa: BLE001 -- any failure: no plan
        log.debug("tccd: no plan saved at %s: %s", path, e)
        return False


def load(path):
    """The plan at `path`, or None (none there, unreadable, or written by
    another version of this package)."""
    try:
        with open(path, "rb") as f:
            plan = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as e:              # noqa: BLE001 -- a damaged plan is no plan
        log.info("tccd: ignoring the plan at %s: %s", path, e)
        return None
    if (not isinstance(plan, dict) or plan.get("version") != PLAN_VERSION
            or plan.get("package") != package_hash()):
        log.info("tccd: ignoring the plan at %s: written by another tccd", path)
        return None
    return plan
