"""A graph's recipe: its partitioning, saved next to its AOTAutograd entry.

A process that loads a graph from the AOTAutograd cache (aot_cache.py)
would still unpickle its fake-tensor graph (GraphPickler: about 0.1 s a
graph on ResNet) and partition it again (verdicts, fusion, output assemblies:
as long again) before asking the daemon for kernels it already holds.
When a CPU graph has set up and run its first call (partitions that
compile lazily -- dynamic shapes -- have their kernels by then), what it
made is saved as a recipe:

  forward     the partitioned graph's Python code (FX's codegen of the
              top level: placeholders, partition calls, getitems, the
              ATen ops that run eagerly -- none that mutates -- and
              get_attr constants) and the globals that code names
  partitions  per partition: name, op count, baked constants, the
              OutputAssembly's steps, and per input signature the
              CompileRequest that made its kernel and its seed count
              (key None: the partition's dynamic-shape kernel, for every
              size its guards admit)
  record      the graph's stats record

The next hit on the same entry (same AOTAutograd key, same kind of graph)
is set up from the recipe (dynamo._CompiledGraph._setup_from_recipe):
the requests go to the daemon in parallel (cache hits, verified and
loaded as always) and the code runs with the RestoredPartitions as
`self`; no fake tensors, no fx graph. Whatever the recipe did not
foresee -- inputs laid out as it never saw, a view that does not fit, a
request the daemon refuses -- raises Unforeseen (or fails setup), and
the graph is loaded from the entry and partitioned as before.

A recipe also records a hash of this package's sources (package_hash): one
written by other code (another tccd: another encoding of the requests,
another partitioner) is ignored, and the graph partitions and saves anew.

Recipes live in <torch's cache dir>/tccd/recipes/<key>-<kind>.recipe: the
same trust as the AOTAutograd entries beside them (pickles too). Kernels
never come from a recipe, only from the daemon, signed and verified.
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

RECIPE_VERSION = 1        # bump when what a recipe holds changes


class Unforeseen(Exception):
    """A graph set up from a recipe met something the recipe has no answer
    for."""


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
    """Where the recipe of graph `kind` of AOTAutograd entry `key` lives."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "tccd", "recipes", f"{key}-{kind}.recipe")


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


def save(path, recipe):
    """Writes `recipe` (a dict) to `path` atomically. Returns whether it did;
    a recipe that does not pickle or a cache dir that is not writable only
    costs the next process its shortcut."""
    try:
        data = pickle.dumps(dict(recipe, version=RECIPE_VERSION, package=package_hash()),
                            protocol=pickle.HIGHEST_PROTOCOL)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".recipe-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
        return True
    except Exception as e:              # noqa: BLE001 -- any failure: no recipe
        log.debug("tccd: no recipe saved at %s: %s", path, e)
        return False


def load(path):
    """The recipe at `path`, or None (none there, unreadable, or written by
    another version of this package)."""
    try:
        with open(path, "rb") as f:
            recipe = pickle.load(f)
    except FileNotFoundError:
        return None
    except Exception as e:              # noqa: BLE001 -- a damaged recipe is none
        log.info("tccd: ignoring the recipe at %s: %s", path, e)
        return None
    if (not isinstance(recipe, dict) or recipe.get("version") != RECIPE_VERSION
            or recipe.get("package") != package_hash()):
        log.info("tccd: ignoring the recipe at %s: written by another tccd", path)
        return None
    return recipe
