"""The torch.compile backend "tccd".

    torch.compile(model, backend="tccd")                    # entry point, no import
    torch.compile(model, backend="tccd", mode="max-autotune")
    torch.compile(model, backend="tccd", options={"fallback": "eager"})
    torch.compile(model, backend=tccd.backend(mode="max-autotune", fallback="eager"))

Pipeline for one Dynamo graph:

  Dynamo FX graph
    -> AOTAutograd (core ATen decompositions): forward + backward graphs
       (or one inference graph), each handed to a _CompiledGraph
    -> on its first call (_CompiledGraph._setup):
       op table (Compiler.Ops, or trial compiles) -> verdict per node
       -> maximal partitions of supported nodes (partition.py)
       -> each partition becomes a CompiledPartition module; the rest of
          the graph stays as FX nodes and runs eagerly
       -> every partition with static shapes is compiled right away, all
          in parallel (Compile + Fetch + verify + dlopen, libtccclient)
    -> each call: the graph module runs; a CompiledPartition looks up the
       kernel for its inputs' signature (dtype, sizes, strides, offset),
       compiling on a miss, allocates outputs as the manifest says and
       calls the kernel with data pointers.

Setup happens on the first call, not inside Dynamo, so a daemon that is
down raises a TccdError from that call (and the next call tries again)
instead of poisoning Dynamo's cache; with fallback="eager" the graph warns
once and runs eagerly for good.

Errors: UNAVAILABLE/DEADLINE_EXCEEDED/compile failures raise a TccdError
subclass (or, with fallback="eager", warn with TccdFallbackWarning and run
eagerly). UNIMPLEMENTED or INVALID_ARGUMENT for a partition means the
daemon does not take it after all (an op, dtype or argument form it lacks):
that partition runs eagerly (logged, counted as fallback).
"""
import collections.abc
import concurrent.futures
import contextlib
import copy
import functools
import hashlib
import itertools
import logging
import os
import statistics
import threading
import time
import types
import warnings

import torch

try:
    from torch._C._dynamo.guards import TensorGuards as _TensorGuards
except ImportError:                  # a torch without it: partitions key every call
    _TensorGuards = None

from . import _stats
from . import aot_cache, hugepages, targets
from . import graph as G
from . import partition as P
from . import recipe
from ._proto import tcc_pb2 as pb
from .client import Client
from .config import Config
from .dtypes import dtype_to_pb, mode_to_pb
from .errors import (TccdCompileError, TccdDeadlineExceeded, TccdError, TccdFallbackWarning,
                     TccdUnavailable, TccdUnsupported)

log = logging.getLogger("tccd")

MAX_REPARTITIONS = 8            # setup rounds that learn which nodes the daemon refuses
MAX_CONSTANT_BYTES = 64 << 10   # get_attr tensors up to this size are baked into the kernel
GUARD_ROUNDS = 7                # the eager guard: timed runs of kernel and eager each ...
GUARD_MIN_ROUNDS = 3            # ... fewer (not under this) once GUARD_BUDGET_S is spent
GUARD_BUDGET_S = 0.5
GUARD_MARGIN = 1.05             # eager wins when its median is this much below the kernel's
GUARD_KERNEL_WARMUPS = 5        # untimed kernel runs first: the CPU thread governor's warm-up
                                # and sampling calls (0-4, two of them on one thread)
_graph_ids = itertools.count(1)


def _check_switch():
    """TCC_CHECK=1 (debug): compare every partition with eager. Its old
    name TCCD_CHECK is still read, with a warning, until 0.2 (deprecated)."""
    v = os.environ.get("TCC_CHECK", "")
    if not v and os.environ.get("TCCD_CHECK", ""):
        v = os.environ["TCCD_CHECK"]
        warnings.warn("TCCD_CHECK is deprecated (read until 0.2): set TCC_CHECK",
                      FutureWarning, stacklevel=2)
    return v not in ("", "0")


_CHECK = _check_switch()

# ------------------------------------------------------------------ clients

DOWN_RECHECK_S = 1.0     # fallback="eager": a daemon found unreachable is asked again after this
_clients = {}
_down = {}               # client key -> (time.monotonic() of the failed connect, its TccdError)
_clients_lock = threading.Lock()


def client_for(cfg):
    """The process's Client for cfg's address and deadlines (connects once;
    a failed connect is not cached). Raises TccdError.

    With fallback="eager", a connect that failed UNAVAILABLE or
    DEADLINE_EXCEEDED is remembered for DOWN_RECHECK_S: graphs set up
    meanwhile get the same error at once and run eagerly (no connect
    timeout per graph against a daemon that is not answering); the first
    one after that connects again, so a daemon that comes back is used."""
    key = (os.getpid(), cfg.addr, cfg.deadline_ms, cfg.connect_timeout_ms, cfg.artifact_dir)
    with _clients_lock:
        c = _clients.get(key)
        down = _down.get(key)
    if c is not None:
        return c
    if down is not None and cfg.fallback == "eager":
        age = time.monotonic() - down[0]
        if age < DOWN_RECHECK_S:
            e = down[1]
            raise type(e)(f"{e.message} ({age:.1f} s ago; asked again after {DOWN_RECHECK_S:g} s)",
                          status=e.status, code=e.code, addr=e.addr, what=e.what,
                          request_id=e.request_id)
    try:
        c = Client(cfg.addr, deadline_ms=cfg.deadline_ms, connect_timeout_ms=cfg.connect_timeout_ms,
                   artifact_dir=cfg.artifact_dir)
    except (TccdUnavailable, TccdDeadlineExceeded) as e:
        kept = type(e)(e.message, status=e.status, code=e.code, addr=e.addr, what=e.what,
                       request_id=e.request_id)
        with _clients_lock:     # (a copy: no traceback keeping the caller's frames alive)
            _down[key] = (time.monotonic(), kept)
        raise
    with _clients_lock:
        _down.pop(key, None)
        return _clients.setdefault(key, c)


def request_base(cfg, dynamic, fullgraph, label, cuda_arch=None):
    """A CompileRequest with target (the CPU, or the CUDA arch given),
    options and client label (no graph)."""
    # float32 on CUDA rounds as eager would: TF32 where PyTorch's flags
    # allow it (convolutions by default, matmuls not), read at compile
    # time as Inductor does
    target = (pb.Target(device=pb.CUDA, cuda_arch=cuda_arch,
                        cuda_conv_tf32=bool(torch.backends.cudnn.allow_tf32),
                        cuda_matmul_tf32=bool(torch.backends.cuda.matmul.allow_tf32)) if cuda_arch
              else pb.Target(device=pb.CPU, cpu_isa=cfg.cpu_isa))
    return pb.CompileRequest(
        target=target,
        options=pb.Options(mode=mode_to_pb(cfg.mode), dynamic=bool(dynamic),
                           fullgraph=bool(fullgraph)),
        client=label)


# ------------------------------------------------------------------ partitions

def _device_type(t):
    """t.device.type, without making a torch.device for the usual two."""
    return "cpu" if t.is_cpu else "cuda" if t.is_cuda else t.device.type


def _signature_key(args):
    """A partition's kernel-table key for its inputs: per tensor (dtype,
    sizes, strides, storage offset, device type)."""
    return tuple((a.dtype, a.shape, a.stride(), a.storage_offset(), _device_type(a))
                 for a in args)


_EAGER = object()      # kernel-table entry: this signature runs eagerly


class _Signature:
    """The last signature a partition ran and its kernel, checked in C++ by
    torch's TensorGuards (dtype, device, sizes, strides: ~5 us for 20
    tensors, where building the key tuple takes 20-50 us) plus the storage
    offsets. A partition called with the same layouts step after step
    skips the key."""

    __slots__ = ("guards", "offsets", "key", "kernel")

    def __init__(self, guards, offsets, key, kernel):
        self.guards, self.offsets, self.key, self.kernel = guards, offsets, key, kernel

    @staticmethod
    def of(args, key, kernel):
        """The signature of `args` (whose key is `key`), or None where
        torch has no TensorGuards."""
        if _TensorGuards is None:
            return None
        try:
            guards = _TensorGuards(*args, dynamic_dims_sizes=[list(k[1]) for k in key],
                                   dynamic_dims_strides=[list(k[2]) for k in key])
        except Exception:        # a torch whose TensorGuards differs: no fast path
            return None
        return _Signature(guards, tuple(k[3] for k in key), key, kernel)

    def admits(self, args):
        return (len(args) == len(self.offsets) and self.guards.check(*args)
                and tuple(a.storage_offset() for a in args) == self.offsets)


_ALL_EAGER = object()  # _build's answer when the whole graph runs eagerly


def _fast_runner(sig, outputs_are_kernels, miss):
    """The call of a partition whose inputs are laid out as its last
    signature `sig` and whose outputs are all its kernel's: the kernel's
    signature runner (Kernel.signature_runner: the guards, the storage
    offsets and the run in one generated function; inputs laid out
    otherwise go to `miss`), or None where that does not apply (views
    among the outputs, random ops' seeds, no TensorGuards, a dynamic or
    CUDA kernel)."""
    if sig is None or not outputs_are_kernels or getattr(sig.kernel, "tccd_seeds", 0):
        return None
    make = getattr(sig.kernel, "signature_runner", None)
    return make(sig.guards.check, sig.offsets, miss) if make is not None else None


class _FastSlot:
    """What a partition shares by both its kinds: its signature runner
    (`_fast`), also put where the graph's forward finds the partition
    (`slot`, the graph module's instance dict or a recipe's namespace), so
    that a steady call goes from the forward straight to the runner, one
    Python frame fewer (scripts/bench-overhead). Other inputs reach the
    runner's `miss`, the partition's `_slow`."""

    slot = None

    def _set_fast(self, runner):
        self._fast = runner
        if self.slot is not None:
            self.slot[self.name] = runner if runner is not None else self

    def __call__(self, *args):
        fast = self._fast
        if fast is not None:                           # the usual case: as last call
            return fast(*args)
        return self._slow(*args)


class CompiledPartition(_FastSlot, torch.nn.Module):
    """A partition of supported nodes, called from the graph module like the
    submodule it replaces. Keeps one kernel per input signature."""

    def __init__(self, name, sub_gm, constants, owner):
        super().__init__()
        self.name = name
        self.sub_gm = sub_gm
        self.constants = constants       # {placeholder index: tensor}
        self.owner = owner
        self.n_ops = P.count_ops(sub_gm)
        self.assembly = P.OutputAssembly(sub_gm)  # views among the outputs come back as aliases
        self.kernel_gm = self.assembly.kernel_gm   # what the daemon compiles (None: nothing)
        self.eager_reason = None         # set when the whole partition runs eagerly
        self._kernels = {}
        self._dyn = None                 # a dynamic-shape Kernel (ABI 2), when compiled
        self._last = None                # _Signature of the last static kernel run
        self._fast = None                # its kernel's signature runner (_fast_runner), or None
        self.dyn_refused = None          # why the daemon compiled no dynamic kernel
        self.requests = {}               # key -> CompileRequest bytes, for the recipe (setup only)
        self._guard = owner.cfg.eager_guard and not _CHECK
        self._judged = set()             # keys the eager guard has timed
        self._lock = threading.Lock()

    def _full(self, args):
        """The sub-graph's arguments: `args` with the constants put back."""
        if not self.constants:
            return args
        it = iter(args)
        n = len(self.constants) + len(args)
        return [self.constants[i] if i in self.constants else next(it) for i in range(n)]

    def _eager(self, args):
        return self.sub_gm(*self._full(args))

    def _outputs(self, key, args, kernel_outs):
        """The partition's outputs: the kernel's, and views of them or of
        the inputs as aliases (OutputAssembly). A view this layout cannot make
        sends the signature to eager."""
        try:
            return self.assembly.assemble(key, self._full(args), kernel_outs)
        except RuntimeError as e:
            log.info("tccd: %s: an output view does not fit the kernel's layout (%s); this "
                     "signature runs eagerly", self.name, e)
            with self._lock:
                self._kernels[key] = _EAGER
                self._last = None
                self._set_fast(None)
            _stats.add(fallback_ops=self.n_ops)
            return self._eager(args)

    def _slow(self, *args):
        if self.eager_reason is not None:
            return self._eager(args)
        last = self._last
        if last is not None and last.admits(args):   # the usual case: as last call
            key, k = last.key, last.kernel
        else:
            key = _signature_key(args)
            if self.kernel_gm is None:                # only views of the inputs
                if self._kernels.get(key) is _EAGER:
                    return self._eager(args)
                return self._outputs(key, args, [])
            k = self._kernels.get(key)
            if k is None and self._dyn is not None and self._dyn.accepts(args):
                k = self._kernels[key] = self._dyn      # its guards admit these sizes
            if k is None:
                k = self.kernel_for(key)
            if self._guard and k is not _EAGER and key not in self._judged:
                k = self._judge(key, k, args)
            if k is _EAGER:
                return self._eager(args)
            if k is not self._dyn:                    # a dynamic kernel's sizes vary
                self._last = _Signature.of(args, key, k)
                self._set_fast(_fast_runner(self._last, self.assembly.trivial and not _CHECK, self._slow))
        run_args = self._kernel_args(k, args)
        if _CHECK:
            return self._checked(k, key, args, run_args)
        if self.assembly.trivial:          # every output is the kernel's
            return k.run(run_args, check=False)
        return self._outputs(key, args, k.run(run_args, check=False))

    def _checked(self, k, key, args, run_args):
        """TCC_CHECK=1: runs the partition eagerly too and compares."""
        got = self._outputs(key, args, k.run(run_args, check=True))
        want = self._eager(args)
        for i, (g, w) in enumerate(zip(got, want)):
            if g.shape != w.shape or g.dtype != w.dtype or not torch.allclose(
                    g, w, rtol=1e-4, atol=1e-5, equal_nan=True):
                raise TccdError(f"{self.name} output {i} differs from eager: "
                                f"max |diff| {(g.double() - w.double()).abs().max().item()}"
                                f"\n{self.sub_gm.code}", status="INTERNAL", what="check")
        return got

    forward = _FastSlot.__call__

    def _kernel_args(self, k, args):
        """The kernel's arguments: `args`, and fresh seed tensors for
        random ops."""
        if not getattr(k, "tccd_seeds", 0):
            return args
        return tuple(args) + tuple(G.fresh_seeds(
            k.tccd_seeds, args[0].device if args else self.owner.device))

    def _judge(self, key, k, args):
        """The eager guard (Config.eager_guard; on in the max-autotune
        modes): before a signature's kernel first runs, it is timed against
        the partition's own ops run eagerly on the same inputs (_race). A
        kernel slower than eager by more than GUARD_MARGIN gives way: the
        signature runs eagerly from then on, so compiling never makes it
        slower. Partitions are pure functions of their inputs (no op in
        them mutates), so the extra runs change nothing; the RNG state of
        eager's random ops is put back. Returns `k` or _EAGER."""
        self._judged.add(key)
        t0 = time.perf_counter()
        cuda = self.owner.device == "cuda"
        sync = torch.cuda.synchronize if cuda else None
        rng = torch.random.get_rng_state()
        cuda_rng = torch.cuda.get_rng_state(self.owner.cuda_index) if cuda else None
        try:
            kernel_s, eager_s = _race(lambda: k.run(self._kernel_args(k, args), check=False),
                                      lambda: self._eager(args), sync, warm_a=GUARD_KERNEL_WARMUPS)
        finally:
            torch.random.set_rng_state(rng)
            if cuda:
                torch.cuda.set_rng_state(cuda_rng, self.owner.cuda_index)
        _stats.add(guard_checks=1, guard_seconds=time.perf_counter() - t0)
        if eager_s * GUARD_MARGIN >= kernel_s:
            log.debug("tccd: graph %d %s: kernel %.3f ms, eager %.3f ms: the kernel runs",
                      self.owner.id, self.name, kernel_s * 1e3, eager_s * 1e3)
            return k
        log.info("tccd: graph %d %s (%d ops): eager runs these inputs in %.3f ms, the kernel "
                 "in %.3f ms; they run eagerly", self.owner.id, self.name, self.n_ops,
                 eager_s * 1e3, kernel_s * 1e3)
        _stats.add(guarded_ops=self.n_ops)
        with self._lock:
            self._kernels[key] = _EAGER
            if self._last is not None and self._last.key == key:
                self._last = None
                self._set_fast(None)
        return _EAGER

    def kernel_for(self, key):
        """The kernel for a signature key, compiled on a miss (or _EAGER)."""
        with self._lock:
            k = self._kernels.get(key)
            if k is None:
                k = self.owner.compile_partition(self, key)
                self._kernels[key] = k
            return k

    def sym_sizes(self, key):
        """Dynamic shapes: for each non-constant placeholder, the symbol
        name of each dim ("s0", "" static) as Dynamo traced it (a plain
        symbol keeps its name; an expression such as s0*s1 gets a name of
        its own), or None when no dim is symbolic. An input that is not
        contiguous in `key` gets no symbols."""
        phs = [n for n in self.sub_gm.graph.nodes if n.op == "placeholder"]
        vals = [G.meta_val(n) for i, n in enumerate(phs) if i not in self.constants]
        out, any_sym = [], False
        for v, k in zip(vals, key):
            names = []
            if isinstance(v, torch.Tensor):
                sizes, strides = k[1], k[2]
                contiguous = tuple(strides) == G.contiguous_strides(sizes) or any(
                    s == 0 for s in sizes)
                for s in v.shape:
                    name = ""
                    if contiguous and isinstance(s, torch.SymInt):
                        expr = getattr(s.node, "expr", None)
                        if expr is not None and getattr(expr, "is_Symbol", False):
                            name = str(expr)
                        elif expr is not None and not getattr(expr, "is_number", False):
                            # A size expression (s0*s1 after a flattening view):
                            # its own symbol to the daemon; equal expressions
                            # share it, and the kernel's guards check every dim.
                            name = "e" + hashlib.sha1(str(expr).encode()).hexdigest()[:16]
                    names.append(name)
            any_sym = any_sym or any(names)
            out.append(names)
        return out if any_sym else None

    def set_eager(self, reason):
        self.eager_reason = reason
        self._set_fast(None)

    @staticmethod
    def key_of_vals(vals):
        """The signature key for fake values (None when any is symbolic)."""
        key = []
        for v in vals:
            if not isinstance(v, torch.Tensor) or not G.is_concrete(v):
                return None
            key.append((v.dtype, v.shape, v.stride(), v.storage_offset(), v.device.type))
        return tuple(key)


class RestoredPartition(_FastSlot):
    """A partition restored from a saved recipe (recipe.py): the kernels
    of the input signatures it was set up with, its constants and output
    steps; no graph. Inputs laid out any other way raise
    recipe.Unforeseen, and the graph goes back to partitioning."""

    def __init__(self, name, n_ops, constants, assembly, has_kernel):
        self.name = name
        self.n_ops = n_ops
        self.constants = constants
        self.assembly = assembly         # OutputAssembly without its graph
        self.has_kernel = has_kernel     # False: the outputs are views of the inputs
        self.kernels = {}                # signature key -> Kernel
        self.dyn = None                  # a dynamic-shape kernel, for any sizes it admits
        self.eager_reason = None
        self._last = None
        self._fast = None

    _full = CompiledPartition._full

    def _slow(self, *args):
        last = self._last
        if last is not None and last.admits(args):
            key, k = last.key, last.kernel
        else:
            key = _signature_key(args)
            k = None
            if self.has_kernel:
                k = self.kernels.get(key)
                if k is None and self.dyn is not None and self.dyn.accepts(args):
                    k = self.kernels[key] = self.dyn
                if k is None:
                    raise recipe.Unforeseen(f"{self.name}: inputs laid out as the recipe never saw")
                if k is not self.dyn:             # a dynamic kernel's sizes vary
                    self._last = _Signature.of(args, key, k)
                    self._set_fast(_fast_runner(self._last, self.assembly.trivial, self._slow))
        outs = []
        if k is not None:
            run_args = args
            if k.tccd_seeds:
                run_args = tuple(args) + tuple(G.fresh_seeds(k.tccd_seeds, "cpu"))
            outs = k.run(run_args, check=False)
        try:
            return self.assembly.assemble(key, self._full(args), outs)
        except RuntimeError as e:
            raise recipe.Unforeseen(f"{self.name}: an output view does not fit ({e})") from None


# ------------------------------------------------------------------ graphs

class _CompiledGraph:
    """The callable AOTAutograd gets for one graph (boxed calling
    convention). Partitions and compiles on the first call."""

    def __init__(self, gm, kind, cfg, dynamic, fullgraph, fresh_copy=None, load_source=None,
                 saved_recipe=None, recipe_path=None, channels_last_outputs=()):
        self.source_gm = gm              # as AOTAutograd gave it (None: not loaded yet)
        # forward outputs laid out channels last (_channels_last_activations)
        self.channels_last_outputs = tuple(channels_last_outputs)
        self.gm = gm                     # the graph that runs (a partitioned copy once built)
        # () -> a copy of source_gm to partition, so that source_gm stays
        # as given (a graph loaded from the AOTAutograd cache, which keeps
        # its bytes, hands over source_gm itself the first time)
        self.fresh_copy = fresh_copy or (lambda: copy.deepcopy(self.source_gm))
        self.load_source = load_source   # () -> source_gm, when gm is None
        self.saved_recipe = saved_recipe  # a recipe (recipe.py) to set up from, once
        self.recipe_path = recipe_path  # where this graph's recipe is saved (None: nowhere)
        self._recipe_pending = recipe_path is not None   # kernel requests are kept until it is
        self.plan = None                 # a plan.PendingPlan waiting for this graph's recipe
        self.kind = kind
        self.cfg = cfg
        self.dynamic = dynamic
        self.fullgraph = fullgraph
        self.id = next(_graph_ids)
        self._boxed_call = True
        self._run = None
        # The graph's forward (unboxed arguments) when the runner is that
        # alone: a partitioned or restored graph past its first call.
        # TccdOutputCode calls it straight, two Python frames fewer a call
        # (scripts/bench-overhead); a restored one may raise
        # recipe.Unforeseen (_unforeseen).
        self.forward = None
        self._built_forward = None       # the partitioned graph module's forward (_build)
        self._lock = threading.Lock()
        self.client = None
        self.base = None
        self.partitions = []
        self.record = None
        self.reasons = {}
        self.n_ops = 0
        self.device = "cpu"              # the target: "cpu", or "cuda" (cfg.cuda="compile")
        self.cuda_index = None
        self._built = None
        self._learned = False

    def __call__(self, args):
        run = self._run
        if run is None:
            run = self._setup()
            if self.kind == "inference" and self.cfg.huge_pages:
                # the weights it streams, once, after the first call: the
                # collapse holds the page tables' lock, which stalled that
                # call's page faults (0.4-0.6 s on BERT-base)
                out = run(args)
                hugepages.collapse(args)
                return out
        return run(args)

    # ---------------------------------------------------------------- setup

    def _eager_runner(self):
        gm = self.gm
        return lambda args: gm(*args)

    def _setup(self):
        with self._lock:
            if self._run is not None:
                return self._run
            t0 = time.perf_counter()
            try:
                saved, self.saved_recipe = self.saved_recipe, None
                # (TCC_CHECK compares partitions with eager: it partitions)
                if saved is not None and not _CHECK:
                    try:
                        run = self._setup_from_recipe(saved)
                    except TccdError:        # unreachable: the next call tries again
                        self.saved_recipe = saved
                        raise
                    if run is not None:
                        self._run = run
                        self.forward = run.forward
                        return run
                if self.gm is None:
                    self.gm = self.source_gm = self.load_source()
                if self._built is None:
                    self._built = self._build()
                run = self._built
                if run is not _ALL_EAGER:
                    for _ in range(MAX_REPARTITIONS):
                        self._learned = False
                        self._precompile()
                        if not self._learned:
                            break
                        # The daemon refused nodes it named: partition again
                        # without them, from the graph as AOTAutograd gave it.
                        self.partitions = []
                        run = self._built = self._build()
                    self._account()
                    if self._recipe_pending:
                        run = self._saving_recipe_after(run)
                else:
                    run = self._eager_runner()
            except TccdError as e:
                if self.cfg.fallback != "eager" or self._built is not None:
                    raise
                if self.gm is None:      # the daemon failed a setup from a recipe
                    self.gm = self.source_gm = self.load_source()
                msg = f"tccd: {e}; graph {self.id} ({self.kind}) runs eagerly"
                warnings.warn(msg, TccdFallbackWarning, stacklevel=3)
                log.warning("%s", msg)
                self._account_eager(f"tccd failed: {e}")
                run = self._eager_runner()
            finally:
                _stats.add(setup_seconds=time.perf_counter() - t0)
            self._run = run
            if run is self._built:
                self.forward = self._built_forward
            return run

    def _setup_from_recipe(self, saved):
        """Sets the graph up from a saved recipe: every kernel it names
        fetched (in parallel) and its forward. Returns its boxed runner, or
        None when the recipe cannot be used (logged; the caller partitions)."""
        try:
            self.client = client_for(self.cfg)
            label = f"python pid {os.getpid()} graph {self.id} ({self.kind})"
            parts, jobs = [], []
            for sp in saved["partitions"]:
                pp = RestoredPartition(sp["name"], sp["n_ops"], sp["constants"], sp["assembly"],
                                       sp["has_kernel"])
                parts.append(pp)
                for key, request, seeds, n_outputs in sp["kernels"]:   # key None: dynamic
                    req = pb.CompileRequest.FromString(request)
                    req.client = f"{label} {pp.name}"
                    jobs.append((pp, key, req, seeds, n_outputs))

            def fetch(job):
                pp, key, req, seeds, n_outputs = job
                t0 = time.perf_counter()
                kernel, resp = self._get_kernel(req)
                if len(resp.manifest.outputs) != n_outputs:
                    n = len(resp.manifest.outputs)
                    raise recipe.Unforeseen(f"{pp.name}: the kernel has {n} outputs, "
                                            f"the recipe {n_outputs}")
                if key is None and not kernel.dynamic:
                    raise recipe.Unforeseen(f"{pp.name}: the daemon made no dynamic kernel")
                kernel.tccd_seeds = seeds
                return kernel, resp, t0

            if len(jobs) <= 1:
                fetched = [fetch(j) for j in jobs]
            else:
                with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(jobs))) as ex:
                    fetched = [f.result() for f in [ex.submit(fetch, j) for j in jobs]]
            for (pp, key, *_), (kernel, resp, t0) in zip(jobs, fetched):
                _count_kernel(resp, t0, dynamic=kernel.dynamic)   # counted once all came
                if key is None:
                    pp.dyn = kernel
                else:
                    pp.kernels[key] = kernel
            owner = types.SimpleNamespace(**saved["attrs"], **{p.name: p for p in parts})
            for p in parts:
                p.slot = vars(owner)
            forward = recipe.make_forward(saved["source"], saved["globals"], owner,
                                          f"<tccd recipe: graph {self.id} ({self.kind})>")
        except (TccdUnavailable, TccdDeadlineExceeded):
            raise                       # partitioning would wait for the daemon again
        except Exception as e:          # noqa: BLE001 -- any surprise: partition as before
            log.info("tccd: graph %d (%s): not set up from its saved recipe (%s); "
                     "partitioning", self.id, self.kind, e)
            return None
        self.partitions = parts
        self.n_ops = saved["record"]["ops"]
        # "planned": the old name of from_recipe, kept until 0.2 (deprecated)
        self.record = dict(saved["record"], id=self.id, kind=self.kind, from_recipe=True,
                           from_plan=saved.get("origin") == "plan",
                           planned=True)
        rec = self.record
        _count_record(rec)
        from_plan = saved.get("origin") == "plan"
        if not from_plan:
            _stats.add(aot_recipe_hits=1)
        _stats.add_graph(rec)
        log.info("tccd: graph %d (%s): %d ops, %d compiled in %d partition(s), %d fall back; "
                 "from %s", self.id, self.kind, rec["ops"], rec["compiled_ops"],
                 rec["partitions"], rec["fallback_ops"],
                 "the daemon's plan" if from_plan else "its saved recipe")

        def run(args):
            try:
                return forward(*args)
            except recipe.Unforeseen as e:
                return self._unforeseen(e, forward, args)
        run.forward = forward
        return run

    def _unforeseen(self, e, forward, args):
        """Runs `args` after the restored graph whose forward is `forward`
        met inputs its recipe never saw (`e`): partitions it again first.
        The partitions are pure functions of their inputs, so running the
        whole graph again from the top is safe."""
        log.info("tccd: graph %d (%s): %s; partitioning", self.id, self.kind, e)
        with self._lock:
            if self.forward is forward:
                _count_record(self.record, -1)   # the setup that follows counts it
                self._run = self.forward = None
                self.partitions = []
                self.record = None
                self._recipe_pending = True
        return self(args)

    def _saving_recipe_after(self, run):
        """`run`, saving the recipe once its first call returns: partitions
        that compile on their first call (dynamic shapes) have their
        kernels by then."""
        def first(args):
            out = run(args)
            with self._lock:
                if self._run is first:
                    self._run = run
                    self.forward = self._built_forward
                    self._save_recipe()
            return out
        return first

    def _save_recipe(self):
        """Saves this graph's partitioning as a recipe (recipe.py) when a
        recipe can stand for it (_capture_recipe)."""
        self._recipe_pending = False
        try:
            saved = self._capture_recipe()
        finally:
            for p in self.partitions:
                p.requests = {}
        if saved is not None and recipe.save(self.recipe_path, saved):
            log.debug("tccd: graph %d (%s): recipe saved at %s", self.id, self.kind,
                      self.recipe_path)
        pending, self.plan = self.plan, None
        if pending is not None:
            pending.graph_ready(self, saved)

    def _capture_recipe(self):
        """The recipe of this graph as set up, or None where a recipe cannot
        stand for it: a CUDA graph, a partition that runs eagerly or has
        a kernel whose request was not kept, a top-level node that is not
        a partition call, getitem, non-mutating ATen op, size arithmetic
        or a constant."""
        if self.device != "cpu" or self.record is None or not self.partitions:
            return None
        attrs = {}
        for n in self.gm.graph.nodes:
            if n.op == "get_attr":
                t = _get_attr(self.gm, n.target)
                if "." in n.target or not isinstance(t, torch.Tensor) or t.requires_grad \
                        or t.numel() * t.element_size() > aot_cache.MAX_HASHED_CONSTANT_BYTES:
                    return None
                attrs[n.target] = t
            elif n.op == "call_function" and not G.is_getitem(n):
                # an op that runs eagerly, or size arithmetic (dynamic
                # shapes): the recipe calls it as the graph does; no op that
                # mutates (an unforeseen call runs the graph again from the
                # top) but write_in_place's, which writes the same rows again
                # into a cache nothing before it reads
                if isinstance(n.target, torch._ops.OpOverload):
                    if n.target._schema.is_mutable and not P.writes_in_place(n):
                        return None
                elif getattr(n.target, "__module__", None) not in ("_operator", "math"):
                    return None
            elif n.op not in ("placeholder", "output", "call_module", "call_function"):
                return None
        parts = []
        for p in self.partitions:
            if p.eager_reason is not None:
                return None
            kernels, dyn = [], None
            for key, k in p._kernels.items():
                if k is _EAGER:
                    return None
                if k is p._dyn:            # one request for every size it admits
                    if dyn is None and key in p.requests:
                        dyn = (None, p.requests[key], k.tccd_seeds, k.n_outputs)
                    continue
                if key not in p.requests:
                    return None
                kernels.append((key, p.requests[key], k.tccd_seeds, k.n_outputs))
            if p._dyn is not None:
                if dyn is None:
                    return None
                kernels.append(dyn)
            if p.kernel_gm is not None and not kernels:
                return None
            parts.append(dict(name=p.name, n_ops=p.n_ops, constants=p.constants,
                              assembly=p.assembly, has_kernel=p.kernel_gm is not None,
                              kernels=kernels))
        source, names = recipe.forward_source(self.gm)
        return dict(source=source, globals=names, attrs=attrs, partitions=parts,
                    record={k: v for k, v in self.record.items() if k not in ("id", "kind")})

    def _account_eager(self, reason):
        n = P.count_ops(self.gm)
        names = P.op_names(self.gm)
        _stats.add(graphs=1, eager_graphs=1, ops=n, fallback_ops=n)
        _stats.add_fallback(names)
        self.record = dict(id=self.id, kind=self.kind, ops=n, compiled_ops=0, fallback_ops=n,
                           partitions=0, eager=True, reason=reason, fallback=dict(names))
        _stats.add_graph(self.record)
        log.info("tccd: graph %d (%s): %d ops run eagerly: %s", self.id, self.kind, n, reason)

    def _build(self):
        """Partitions the graph and installs CompiledPartitions (nothing is
        compiled yet). Every daemon call that can fail comes before the
        graph is changed. Returns the boxed runner, or _ALL_EAGER."""
        gm = self.gm
        _lay_out_channels_last(gm, self.channels_last_outputs)
        devices = {G.meta_val(n).device for n in gm.graph.nodes if n.op == "placeholder"
                   and isinstance(G.meta_val(n), torch.Tensor)}
        kinds = {d.type for d in devices}
        cuda_arch = None
        if kinds - {"cpu"}:
            if kinds != {"cuda"} or len(devices) != 1:
                what = ", ".join(sorted(kinds))
                self._account_eager(f"{what} tensors: tccd compiles graphs whose tensors are "
                                    "all on the CPU or all on one CUDA device")
                return _ALL_EAGER
            if self.cfg.cuda != "compile":
                self._account_eager("cuda tensors run eagerly unless cuda='compile' "
                                    "(TCCD_CUDA=compile)")
                return _ALL_EAGER
            from .client import cuda_device_arch

            self.device = "cuda"
            self.cuda_index = next(iter(devices)).index or 0
            cuda_arch = cuda_device_arch(self.cuda_index)[0]
        self.client = client_for(self.cfg)
        gm = self.gm = self.fresh_copy()
        table = P.op_table(self.client, self.cfg, pb.CUDA if cuda_arch else pb.CPU)
        label = f"python pid {os.getpid()} graph {self.id} ({self.kind})"
        self.base = request_base(self.cfg, self.dynamic, self.fullgraph, label, cuda_arch)
        _read_constants_directly(gm)
        P.splits_to_slices(gm)
        self.n_ops = P.count_ops(gm)
        verdict, trials = P.verdicts(gm, table, self.client, self.base, self.device)
        _stats.add(trial_compiles=trials)
        parts = P.propose(gm, verdict, table)
        # from here on the graph changes
        self.reasons = {}
        for n, (ok, why) in verdict.items():
            if not ok and not G.is_getitem(n) and not P.writes_in_place(n):
                self.reasons.setdefault(why, set()).add(str(n.target))
        for name, sub in P.fuse(gm, parts):
            self.partitions.append(self._install(name, sub))
        gm.recompile()
        # gm.forward, not gm(...): a GraphModule's __call__ (the module
        # call and FX's error-wrapping) costs ~7 us a call, more than a
        # small graph's kernels (scripts/bench-overhead)
        forward = self._built_forward = gm.forward
        return lambda args: forward(*args)

    def _account(self):
        """Counts and logs the graph once its partitions are compiled."""
        gm = self.gm
        compiled = sum(p.n_ops for p in self.partitions if p.eager_reason is None)
        fallback = self.n_ops - compiled
        names = P.op_names(gm)
        reasons = self.reasons
        for p in self.partitions:
            if p.eager_reason is not None:
                sub_names = P.op_names(p.sub_gm)
                for k, v in sub_names.items():
                    names[k] = names.get(k, 0) + v
                reasons.setdefault(p.eager_reason, set()).update(sub_names)
        live = [p for p in self.partitions if p.eager_reason is None]
        # write_in_place's writes: between partitions (eager), or inside
        # them (compiled, unless the partition runs eagerly)
        between = P.count_writes_in_place(gm)
        inside = [(p, P.count_writes_in_place(p.sub_gm)) for p in self.partitions]
        self.record = dict(id=self.id, kind=self.kind, ops=self.n_ops, compiled_ops=compiled,
                           fallback_ops=fallback, partitions=len(live), eager=False,
                           writes_in_place=between + sum(n for _, n in inside),
                           eager_writes_in_place=between + sum(n for p, n in inside
                                                               if p.eager_reason is not None),
                           fallback=dict(names),
                           reasons={k: sorted(v) for k, v in reasons.items()})
        _count_record(self.record)
        _stats.add_graph(self.record)
        top = ", ".join(f"{k} x{v}" if v > 1 else k
                        for k, v in sorted(names.items(), key=lambda kv: (-kv[1], kv[0])))
        log.info("tccd: graph %d (%s): %d ops, %d compiled in %d partition(s), %d fall back%s",
                 self.id, self.kind, self.n_ops, compiled, len(live), fallback,
                 f": {top}" if top else "")
        for why, ops in sorted(reasons.items()):
            log.debug("tccd: graph %d: eager because %s: %s", self.id, why, ", ".join(sorted(ops)))

    def _install(self, name, sub):
        """Swaps the fused submodule `name` for a CompiledPartition; get_attr
        tensors it reads (small ones) become kernel constants."""
        gm = self.gm
        node = next(n for n in gm.graph.nodes if n.op == "call_module" and n.target == name)
        constants, args = {}, []
        for i, a in enumerate(node.args):
            if isinstance(a, torch.fx.Node) and a.op == "get_attr":
                t = _get_attr(gm, a.target)
                if (isinstance(t, torch.Tensor) and not t.requires_grad and t.device.type == "cpu"
                        and t.numel() * t.element_size() <= MAX_CONSTANT_BYTES
                        and dtype_to_pb(t.dtype) is not None):
                    constants[i] = t.detach().clone()
                    continue
            args.append(a)
        node.args = tuple(args)
        cp = CompiledPartition(name, sub, constants, self)
        setattr(gm, name, cp)
        # ... and in the instance's dict too, where the generated forward's
        # `self.<name>` finds it without nn.Module.__getattr__ (a Python
        # call), and later its signature runner (_FastSlot)
        gm.__dict__[name] = cp
        cp.slot = gm.__dict__
        return cp

    def _precompile(self):
        """Compiles every partition whose input shapes are static, in parallel."""
        jobs = []
        for p in self.partitions:
            if p.kernel_gm is None:
                continue
            vals = [G.meta_val(n) for i, n in enumerate(
                [n for n in p.sub_gm.graph.nodes if n.op == "placeholder"]) if i not in p.constants]
            key = CompiledPartition.key_of_vals(vals)
            if key is not None:
                jobs.append((p, key))
        if not jobs:
            return
        if len(jobs) == 1:
            p, key = jobs[0]
            p.kernel_for(key)
            return
        with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(jobs))) as ex:
            futs = [ex.submit(p.kernel_for, key) for p, key in jobs]
            errors = []
            for f in futs:
                try:
                    f.result()
                except TccdError as e:
                    errors.append(e)
            if errors:
                raise errors[0]

    # ---------------------------------------------------------------- compile

    def compile_partition(self, part, key):
        """Compiles `part` for signature `key`: a Kernel, or _EAGER when the
        daemon cannot compile it (UNIMPLEMENTED) or, with fallback="eager",
        when compiling fails."""
        if not all(k[4] == self.device for k in key):
            return _EAGER
        specs = [k[:4] for k in key]
        try:
            graph, _, fx_nodes = G.build_graph(part.kernel_gm, specs, part.constants, self.device)
        except G.Unsupported as e:
            self._partition_eager(part, f"cannot encode: {e}")
            return _EAGER
        req = pb.CompileRequest()
        req.CopyFrom(self.base)
        req.graph.CopyFrom(graph)
        req.client = f"{self.base.client} {part.name}"
        t0 = time.perf_counter()
        dyn = self._compile_dynamic(part, key, req)
        if dyn is not None:
            kernel, resp, dreq = dyn
            kernel.tccd_seeds = G.seed_count(graph, specs)
            if kernel.dynamic:
                part._dyn = kernel
            _count_kernel(resp, t0, dynamic=kernel.dynamic)
            if self._recipe_pending:
                part.requests[key] = dreq.SerializeToString()
            log.debug("tccd: graph %d %s: kernel %s over symbols %s", self.id, part.name,
                      resp.guard_hash[:12], ", ".join(kernel.symbols) or "(none)")
            return kernel
        try:
            kernel, resp = self._get_kernel(req)
        except (TccdUnsupported, TccdCompileError) as e:
            if e.status not in ("UNIMPLEMENTED", "INVALID_ARGUMENT"):
                if self.cfg.fallback != "eager":
                    raise
                return self._compile_failed(part, e)
            # The daemon does not take this graph (an op, dtype or argument
            # form it lacks): eager. When it names the node, setup partitions
            # again without that node's form.
            if self.record is None and P.learn_rejection(self.cfg.addr, e.message, fx_nodes):
                self._learned = True
                log.info("tccd: graph %d %s: the daemon refuses %s; partitioning again",
                         self.id, part.name, e.detail)
            elif e.status == "INVALID_ARGUMENT":
                log.warning("tccd: graph %d %s: the daemon rejects the partition (%s); it runs "
                            "eagerly", self.id, part.name, e.detail)
            self._partition_eager(part, f"{e.status}: {e.message}")
            return _EAGER
        except TccdError as e:
            if self.cfg.fallback != "eager":
                raise
            return self._compile_failed(part, e)
        kernel.tccd_seeds = G.seed_count(graph, specs)
        status = _count_kernel(resp, t0)
        if self._recipe_pending:
            part.requests[key] = req.SerializeToString()
        log.debug("tccd: graph %d %s: %s %s (%d kernels, %.1f ms in the daemon)", self.id,
                  part.name, status, resp.guard_hash[:12], len(resp.manifest.kernels),
                  resp.timings.total_ms)
        if status == "miss" and log.isEnabledFor(logging.DEBUG):
            self._log_explanation(part, resp.guard_hash)
        if len(resp.manifest.outputs) != len(part.kernel_gm.graph.output_node().args[0]):
            raise TccdError(f"{part.name}: manifest has {len(resp.manifest.outputs)} outputs, "
                            "the partition more or fewer", status="INTERNAL", addr=self.cfg.addr)
        return kernel

    def _log_explanation(self, part, guard_hash):
        """TORCH_LOGS=tccd at debug level: why a kernel missed the cache,
        as the daemon's Explain answers it (the nearest stored key of the
        same graph and what differs). Never fails the compile."""
        try:
            ex = self.client.explain(guard_hash)
        except TccdError as e:
            log.debug("tccd: graph %d %s: miss %s not explained: %s", self.id, part.name,
                      guard_hash[:12], e)
            return
        log.debug("tccd: graph %d %s: miss %s explained: %s", self.id, part.name,
                  guard_hash[:12], ex.summary)
        for near in ex.nearest[:1]:
            for d in near.differences:
                log.debug("tccd:   %s: %s vs %s (%s %s)", d.component, d.value, d.other,
                          near.kind, near.guard_hash[:12])

    def _compile_dynamic(self, part, key, req):
        """With dynamic shapes on and symbolic placeholders: compiles one
        kernel whose sizes are runtime symbols (the graph inputs' sym_sizes
        as Dynamo named them; a static kernel when every such dim is 0 or 1
        in `key`). Returns (Kernel, CompileResponse, CompileRequest), or None
        when there is nothing symbolic or the daemon cannot do it (the
        partition then compiles per signature, as without dynamic)."""
        if not self.dynamic or part.dyn_refused is not None:
            return None
        syms = part.sym_sizes(key)
        if syms is None:
            return None
        dreq = pb.CompileRequest()
        dreq.CopyFrom(req)
        by_name = {v.name: v for v in dreq.graph.values}
        for name, names in zip(dreq.graph.inputs, syms):
            if any(names):
                by_name[name].meta.sym_sizes.extend(names)
        try:
            kernel, resp = self._get_kernel(dreq)
        except (TccdUnsupported, TccdCompileError) as e:
            if e.status not in ("UNIMPLEMENTED", "INVALID_ARGUMENT", "FAILED_PRECONDITION"):
                raise
            part.dyn_refused = f"{e.status}: {e.message}"
            log.info("tccd: graph %d %s: no dynamic kernel (%s: %s); compiling per signature",
                     self.id, part.name, e.status, e.detail)
            return None
        # A static kernel comes back when every symbolic dim is 0 or 1 here
        # (specialised, as in Dynamo): it serves this signature.
        return kernel, resp, dreq

    def _get_kernel(self, req):
        """Compile + fetch + load. A CUDA artifact loads into the calling
        thread's current context, so it is made PyTorch's for the graph's
        device first (compiles run on worker threads). While tccd.prewarm
        runs, the request is compiled for its targets too."""
        targets.note_request(self.client, req)
        if self.device != "cuda" or not torch.cuda.is_available():
            kernel, resp = self.client.get_kernel(req)
        else:
            with torch.cuda.device(self.cuda_index):
                kernel, resp = self.client.get_kernel(req)
        if self.cfg.mode == "reduce-overhead" and kernel.device_type == "cuda":
            kernel.use_graphs()
        return kernel, resp

    def _compile_failed(self, part, e):
        """fallback="eager": a failed compile warns and runs the partition eagerly."""
        msg = f"tccd: {e}; {part.name} of graph {self.id} ({self.kind}) runs eagerly"
        warnings.warn(msg, TccdFallbackWarning, stacklevel=3)
        log.warning("%s", msg)
        self._partition_eager(part, f"tccd failed: {e}")
        return _EAGER

    def _partition_eager(self, part, reason):
        log.info("tccd: graph %d %s (%d ops) runs eagerly: %s", self.id, part.name, part.n_ops,
                 reason)
        if self.record is None:          # still in setup: counted there
            part.set_eager(reason)
        else:                            # a later signature: only this one falls back
            _stats.add(fallback_ops=part.n_ops)


# what an entry loaded from the AOTAutograd cache becomes (aot_cache.py
# never imports this module: the factory is handed in)
aot_cache.set_graph_factory(_CompiledGraph)


def _race(run_a, run_b, sync=None, warm_a=1):
    """Median seconds of run_a() and of run_b(), timed alternately (which
    goes first alternates too) after warm_a untimed runs of run_a and one
    of run_b: GUARD_ROUNDS rounds, fewer (not under GUARD_MIN_ROUNDS) once
    GUARD_BUDGET_S is spent. `sync` (a CUDA synchronize) is called before
    each clock read. The guard warms a CPU kernel up past its thread
    governor's sampling calls (cpu/prelude.c: calls 3-4 run on one
    thread), which otherwise were two of its timed runs: with 4 rounds
    the kernel's median was half single-threaded, and a whole Llama
    decoder that beat eager by 4% was given to eager."""
    def timed(run):
        if sync is not None:
            sync()
        t = time.perf_counter()
        run()
        if sync is not None:
            sync()
        return time.perf_counter() - t

    for _ in range(max(1, warm_a)):
        run_a()
    run_b()
    ta, tb = [], []
    start = time.perf_counter()
    for i in range(GUARD_ROUNDS):
        if i & 1:
            tb.append(timed(run_b))
            ta.append(timed(run_a))
        else:
            ta.append(timed(run_a))
            tb.append(timed(run_b))
        if i + 1 >= GUARD_MIN_ROUNDS and time.perf_counter() - start > GUARD_BUDGET_S:
            break
    return statistics.median(ta), statistics.median(tb)


def _count_record(rec, sign=1):
    """Adds (sign -1: takes back) a graph record's counts to the stats."""
    _stats.add(graphs=sign, ops=sign * rec["ops"], compiled_ops=sign * rec["compiled_ops"],
               fallback_ops=sign * rec["fallback_ops"], partitions=sign * rec["partitions"])
    _stats.add_fallback({k: sign * v for k, v in rec["fallback"].items()})


def _count_kernel(resp, t0, dynamic=False):
    """Counts a kernel loaded since t0 with the daemon's answer `resp`;
    returns its cache status ("hit", "miss", ...)."""
    status = pb.CacheStatus.Name(resp.cache).lower()
    _stats.add(kernels=1, compile_requests=1, dynamic_kernels=int(dynamic),
               compile_seconds=time.perf_counter() - t0,
               **{f"cache_{status}": 1} if status in ("miss", "hit", "coalesced",
                                                      "remote_hit") else {})
    return status


def _read_constants_directly(gm):
    """`lift_fresh_copy(<get_attr constant>)` copies a constant the program
    made (torch.tensor(...) in traced code) before it is used. Ops that only
    read it (no mutation, no alias returned) are pointed at the constant
    itself, so a partition can bake it in (Graph.constants); the copy stays
    for every other use and goes when nothing uses it."""
    lift = torch.ops.aten.lift_fresh_copy.default
    for n in list(gm.graph.nodes):
        if not (n.op == "call_function" and n.target is lift and len(n.args) == 1
                and isinstance(n.args[0], torch.fx.Node) and n.args[0].op == "get_attr"):
            continue
        const = n.args[0]
        for u in list(n.users):
            t = u.target
            if (u.op == "call_function" and isinstance(t, torch._ops.OpOverload)
                    and not t._schema.is_mutable
                    and all(r.alias_info is None for r in t._schema.returns)):
                u.replace_input_with(n, const)
        if not n.users:
            gm.graph.erase_node(n)
    gm.graph.lint()


def _get_attr(gm, target):
    obj = gm
    for a in target.split("."):
        obj = getattr(obj, a)
    return obj


# ------------------------------------------------------------------ backend

def _is_dynamic(example_inputs):
    for x in example_inputs:
        if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            return True
        if isinstance(x, torch.Tensor) and not G.is_concrete(x):
            return True
    return False


def _dynamo_fullgraph():
    """torch.compile's fullgraph, as Dynamo's current translator knows it."""
    try:
        from torch._dynamo.symbolic_convert import InstructionTranslator

        return bool(InstructionTranslator.current_tx().one_graph)
    except Exception:
        return False


@functools.lru_cache(maxsize=None)
def _decomposition_table():
    from torch._decomp import core_aten_decompositions

    table = core_aten_decompositions()
    # export's CustomDecompTable loads its ATen part when made; the first
    # read of the whole table then "materializes" a decomposition for every
    # CompositeImplicitAutograd op of the other namespaces (c10d_functional,
    # quantized, ...: ~70 ms of a cold start), which AOTAutograd's trace
    # decomposes through their own kernels anyway: the ATen part is the table.
    aten = getattr(table, "decomp_table", None)
    table = dict(aten) if isinstance(aten, dict) else dict(table)
    for name in _KEEP_WHOLE:
        op = _resolve(name)
        if op is not None:
            table.pop(op, None)
    return table


def decompositions():
    """core_aten_decompositions(), less the ones that are wrong in torch.

    torch 2.13's decomposition of aten._scaled_dot_product_flash_attention_for_cpu
    gives wrong gradients for nn.MultiheadAttention's packed q/k/v (about
    0.08 absolute on in_proj_weight's grad in test_models' encoder layer;
    AOTAutograd without it, or with Inductor's table, matches eager to
    1e-9), so that op is kept whole (it runs eagerly until tccd compiles it).
    """
    return dict(_decomposition_table())   # built once per process (~0.1 s)


class _LazyDecompositions(collections.abc.Mapping):
    """decompositions(), built when AOTAutograd first reads it: a graph
    whose AOTAutograd result comes from the cache never does (building the
    table is ~0.1-0.2 s of a warm start)."""

    def __init__(self):
        self._table = None

    def _get(self):
        if self._table is None:
            self._table = decompositions()
        return self._table

    def __getitem__(self, op):
        return self._get()[op]

    def __iter__(self):
        return iter(self._get())

    def __len__(self):
        return len(self._get())


_KEEP_WHOLE = ("aten._scaled_dot_product_flash_attention_for_cpu.default",
               # the daemon compiles these whole; decomposed they are
               # index.Tensor and an accumulating index_put, which it does not
               "aten.embedding.default", "aten.embedding_dense_backward.default")


def _resolve(name):
    obj = torch.ops
    try:
        for part in name.split("."):
            obj = getattr(obj, part)
        return obj
    except (AttributeError, RuntimeError):
        return None


def compile_graph(gm, example_inputs, cfg):
    """Compiles a Dynamo FX graph with `cfg`: AOTAutograd with core ATen
    decompositions, forward and backward graphs handed to tccd. With
    cfg.aot_cache, AOTAutograd's result comes from (and goes to) torch's
    AOTAutogradCache when it can (see aot_cache.py)."""
    dynamic = cfg.dynamic if cfg.dynamic is not None else _is_dynamic(example_inputs)
    fullgraph = cfg.fullgraph if cfg.fullgraph is not None else _dynamo_fullgraph()

    def compiler(kind):
        def compile_one(fx_gm, _example_inputs):
            path = aot_cache.recipe_path(kind) if cfg.aot_cache else None
            cl = _channels_last_activations(fx_gm) if kind == "forward" else ()
            if kind == "backward":
                _restride_placeholders(fx_gm, _example_inputs)
            if kind == "inference":
                P.write_in_place(fx_gm, _data_mutations())
            return _CompiledGraph(fx_gm, kind, cfg, dynamic, fullgraph, recipe_path=path,
                                  channels_last_outputs=cl)
        compile_one.__name__ = f"tccd_{kind}"
        return aot_cache.serializable(compile_one) if cfg.aot_cache else compile_one

    compilers = dict(fw_compiler=compiler("forward"), bw_compiler=compiler("backward"),
                     inference_compiler=compiler("inference"),
                     decompositions=_LazyDecompositions())
    with contextlib.ExitStack() as stack:
        if cfg.aot_cache:
            key_tag = aot_cache.key_tag(cfg, dynamic, fullgraph, _KEEP_WHOLE)
            stack.enter_context(aot_cache.caching(cfg, key_tag, dynamic, fullgraph))
        if cfg.cuda == "compile" and any(isinstance(t, torch.Tensor) and t.is_cuda
                                         for t in example_inputs):
            # On CUDA, scaled_dot_product_attention would trace to PyTorch's
            # flash / memory-efficient kernels, which tccd does not compile:
            # the math backend traces it to matmuls and a softmax instead
            # (cuBLAS steps and fused kernels; forward and backward).
            from torch.nn.attention import SDPBackend, sdpa_kernel

            stack.enter_context(sdpa_kernel([SDPBackend.MATH]))
        return _aot_autograd(gm, example_inputs, **compilers)


def _data_mutations():
    """(graph output, input) pairs of the graph AOTAutograd is compiling:
    the inputs whose data only it mutates (its epilogue copies the output
    into the input), from the tracing context; [] without one."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None)
    if meta is None:
        return []
    out = []
    for k, i in enumerate(meta.mutated_inp_runtime_indices):
        info = meta.input_info[i]
        if info.mutates_data and not info.mutates_metadata and not info.mutates_storage_metadata:
            out.append((k, i))
    return out


def _channels_last_strides(shape):
    n, c, h, w = shape
    return (h * w * c, 1, w * c, c)


def _aliasing(node):
    """Is an FX node's value a view of another's (an ATen op whose
    schema says its result aliases an input, or an element of one)?"""
    if G.is_getitem(node):
        src, i = node.args
        target = getattr(src, "target", None)
        returns = target._schema.returns if isinstance(target, torch._ops.OpOverload) else ()
        return i < len(returns) and returns[i].alias_info is not None
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return True
    return any(r.alias_info is not None for r in target._schema.returns)


_SAME_LAYOUT_VIEWS = (torch.ops.aten.detach.default, torch.ops.aten.alias.default)


def _channels_last_activations(gm):
    """The forward graph of a training step of a convolution network on
    the CPU (one with a 2-D convolution): the outputs it saves for the backward
    that are 4-D floating activations it computes (not inputs, not views,
    not user-visible outputs), laid out channels last as Inductor's layout
    optimization does (a detach or alias of one too: it has the layout of
    what it views). Convolutions and their backward steps then run on
    them as oneDNN's kernels read them, where NCHW had cost a reorder per
    operand (a fifth of ResNet-50's training step). Reports every output's
    strides to AOTAutograd (TracingContext.output_strides), which traces
    the backward graph's inputs so. Returns the output indices."""
    from torch._guards import TracingContext

    tc = TracingContext.try_get()
    meta = getattr(tc, "fw_metadata", None)
    if meta is None or tc.output_strides is None or len(tc.output_strides):
        return ()
    if any(isinstance(v := G.meta_val(n), torch.Tensor) and v.device.type != "cpu"
           for n in gm.graph.nodes if n.op == "placeholder"):
        # CPU only: on CUDA the convolutions are cuDNN's, which then
        # transposes the NHWC operands back, and tccd's per-channel
        # reductions read NHWC across their threads' stride (ResNet-50
        # training on the H200, 2026-11-28: batch-norm backward kernels
        # with one element per 256-byte line).
        return ()
    if not any(n.op == "call_function" and n.target is torch.ops.aten.convolution.default
               and len(G.meta_val(n).shape) == 4 for n in gm.graph.nodes):
        return ()
    if any(n.op == "call_function" and n.target is torch.ops.aten.cat.default
           and len(G.meta_val(n).shape) == 4 for n in gm.graph.nodes):
        # Concatenation networks keep NCHW: DenseNet-121's training step
        # (batch 16 at 128, Xeon VM, codegen 70) 625 ms with NHWC
        # activations, 565 ms NCHW (1026 against 695 before its
        # concatenations ran by ranges).
        return ()
    try:
        saved = meta.tensors_saved_for_backwards_slice
    except (AssertionError, AttributeError, TypeError):
        return ()
    outs = list(gm.graph.output_node().args[0])
    user = {n for n in outs[:saved.start] if isinstance(n, torch.fx.Node)}
    chosen = []
    for i in range(len(outs))[saved]:
        n = outs[i]
        if not isinstance(n, torch.fx.Node) or n in user or n.op != "call_function":
            continue
        base = n
        while base.op == "call_function" and base.target in _SAME_LAYOUT_VIEWS:
            base = base.args[0]    # detach(relu(..)): the layout of what it views
        if not isinstance(base, torch.fx.Node) or base.op != "call_function" or _aliasing(base):
            continue
        v = G.meta_val(n)
        if (isinstance(v, torch.Tensor) and v.dim() == 4 and v.is_floating_point() and G.is_concrete(v)
                and v.shape[1] > 1 and v.shape[2] * v.shape[3] > 1 and v.is_contiguous()):
            chosen.append(i)
    if not chosen:
        return ()
    strides = [None] * len(outs)
    for i in chosen:
        strides[i] = _channels_last_strides(tuple(G.meta_val(outs[i]).shape))
    tc.output_strides.extend(strides)
    _lay_out_channels_last(gm, chosen)
    return tuple(chosen)


def _set_strides(node, strides):
    """node's traced value, a fake tensor, laid out with `strides`."""
    v = G.meta_val(node)
    with v.fake_mode:
        node.meta["val"] = torch.empty_strided(tuple(v.shape), strides, dtype=v.dtype, device=v.device)


def _restride_placeholders(gm, example_inputs):
    """A backward graph's placeholders take the strides of AOTAutograd's
    example inputs where those differ from the traced ones: AOTAutograd
    restrides the examples of activations the forward saved in another
    layout (_channels_last_activations), not the graph's values, which
    the partitions' first requests are built from."""
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(phs) != len(example_inputs):
        return
    for n, ex in zip(phs, example_inputs):
        v = G.meta_val(n)
        if (isinstance(ex, torch.Tensor) and isinstance(v, torch.Tensor) and G.is_concrete(ex)
                and G.is_concrete(v) and ex.dtype == v.dtype and tuple(ex.shape) == tuple(v.shape)
                and tuple(ex.stride()) != tuple(v.stride()) and hasattr(v, "fake_mode")):
            _set_strides(n, tuple(ex.stride()))


def _lay_out_channels_last(gm, indices):
    """Declares forward outputs `indices` (_channels_last_activations)
    channels last in their traced values, which the partitions' requests
    take output layouts from (graph.build_graph)."""
    if not indices:
        return
    outs = list(gm.graph.output_node().args[0])
    for i in indices:
        n = outs[i]
        want = _channels_last_strides(tuple(G.meta_val(n).shape))
        if tuple(G.meta_val(n).stride()) != want:
            _set_strides(n, want)


def _aot_autograd(gm, example_inputs, **kwargs):
    """torch._dynamo.backends.common.aot_autograd(**kwargs)(gm, example_inputs)
    without its import of torch._inductor.debug (0.14 s of every warm
    start, most of Inductor) for a logging context that does nothing unless
    TORCH_COMPILE_DEBUG=1. Debug runs and graphs with nested inputs take
    torch's own path."""
    from torch._dynamo import disable
    from torch._dynamo.backends.common import aot_autograd
    from torch._dynamo.utils import counters
    from torch._functorch.aot_autograd import (SerializableAOTDispatchCompiler,
                                               aot_module_simplified)

    if os.environ.get("TORCH_COMPILE_DEBUG", "0") == "1" or any(
            isinstance(x, (list, tuple, dict)) for x in example_inputs):
        return aot_autograd(**kwargs)(gm, example_inputs)

    def no_dynamo(compile_backward):
        # as torch's: Dynamo traces neither the backward compiler nor the
        # backward it makes (Note [Wrapping bw_compiler in disable])
        def wrapped(*args, **kw):
            return disable(disable(compile_backward, reason="do not trace backward compiler "
                                   "function")(*args, **kw),
                           reason="do not trace generated backwards pass")
        wrapped._is_wrapped_bw_compiler = True
        return wrapped

    bw = kwargs["bw_compiler"]
    if isinstance(bw, SerializableAOTDispatchCompiler):
        bw.compiler_fn = no_dynamo(bw.compiler_fn)
    else:
        kwargs["bw_compiler"] = no_dynamo(bw)
    counters["aot_autograd"]["total"] += 1
    compiled = aot_module_simplified(gm, example_inputs, **kwargs)
    counters["aot_autograd"]["ok"] += 1
    # Not wrapped in torch._dynamo.disable as torch's aot_autograd backend
    # wraps it: Dynamo wraps every compiled graph it installs in one already
    # (output_graph), as it does Inductor's, and a second costs ~6 us a call.
    return compiled


def _merge(base, mode=None, options=None):
    kw = dict(base)
    if options:
        kw.update(options)
    if mode is not None:
        kw["mode"] = mode
    return kw


def tccd_backend(gm, example_inputs, mode=None, options=None):
    """The backend registered as "tccd" (entry point torch_dynamo_backends).
    torch.compile passes `mode` (when not "default") and `options`."""
    return compile_graph(gm, example_inputs, Config.make(**_merge({}, mode, options)))


class Backend:
    """A configured tccd backend: torch.compile(m, backend=tccd.backend(...)).
    torch.compile's own mode=/options= override these."""

    def __init__(self, **options):
        Config.make(**options)           # validate now
        self.options = dict(options)
        self.__name__ = "tccd"

    def __call__(self, gm, example_inputs, mode=None, options=None):
        return compile_graph(gm, example_inputs, Config.make(**_merge(self.options, mode, options)))

    def __eq__(self, other):
        return isinstance(other, Backend) and other.options == self.options

    def __hash__(self):
        return hash(tuple(sorted((k, repr(v)) for k, v in self.options.items())))

    def __repr__(self):
        return f"tccd.backend({', '.join(f'{k}={v!r}' for k, v in self.options.items())})"


def backend(*, addr=None, mode=None, dynamic=None, fullgraph=None, fallback=None,
            deadline_ms=None, connect_timeout_ms=None, artifact_dir=None, cpu_isa=None,
            ops=None, cuda=None, aot_cache=None, plans=None, eager_guard=None):
    """A tccd backend with options (see tccd.config for each and its env
    variable); None = the environment's or the built-in default."""
    kw = dict(addr=addr, mode=mode, dynamic=dynamic, fullgraph=fullgraph, fallback=fallback,
              deadline_ms=deadline_ms, connect_timeout_ms=connect_timeout_ms,
              artifact_dir=artifact_dir, cpu_isa=cpu_isa, ops=ops, cuda=cuda, aot_cache=aot_cache,
              plans=plans, eager_guard=eager_guard)
    return Backend(**{k: v for k, v in kw.items() if v is not None})
