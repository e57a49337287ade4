"""AOTAutograd's result, cached on this node.

A warm process would trace every Dynamo graph through AOTAutograd again
(seconds on BERT) only to get back the forward and backward graphs it had
before, whose kernels the daemon already holds. torch's AOTAutogradCache
stores AOTAutograd's result -- the graphs' runtime metadata and wrappers
-- under a hash of the Dynamo graph, its inputs' metadata and the configs,
in TORCHINDUCTOR_CACHE_DIR next to Inductor's FX graph cache. It takes any
backend whose compilers return an OutputCode:

  compile (miss)   tccd's compiler returns a TccdOutputCode around the
                   _CompiledGraph; AOTAutograd pickles the entry, and
                   prepare_for_serialization turns the graph into
                   GraphPickler bytes: with the nodes' traced values
                   (fake tensors), or, for a CPU graph of static shapes,
                   without them ("light": pickling 747 fake tensors of a
                   BERT-base forward took 0.73 s of a cold first call;
                   without them 0.15 s). A CPU graph's warm start sets up
                   from its recipe and never unpickles it; should it have
                   to, post_compile derives the values again by fake
                   propagation from the inputs (0.5 s on that graph).
  load (hit)       post_compile unpickles the graph under the current fake
                   mode and makes a _CompiledGraph of it again, with the
                   options of the backend call that loads it (or, loaded
                   outside one, the environment's); its kernels then come
                   from the daemon's cache as on any warm start.

This module never imports dynamo.py (which imports it): dynamo hands its
_CompiledGraph in as the graph factory when it is imported
(set_graph_factory), so a load inside or outside a backend call has it.

The key (cache_key) is AOTAutogradCache's own minus Inductor's part: the
Dynamo graph's code, its inputs' metadata (fake tensors, symbolic sizes),
the values of tensor constants, AOTConfig, grad mode, autocast, the
functorch config and torch's version -- hashed by torch's pickler for
these keys -- plus "tccd", this file's entry version, the decomposition
table and the options that shape what tccd compiles (key_tag). Inductor's
part (its config, the hash of its sources, its codegen backends) would
import most of Inductor on every warm start (about 2 s, as long as the
trace it saves) and says nothing about tccd's graphs. The entries live
under keys of their own ("tccd..."), so they never meet Inductor's. A graph
AOTAutogradCache will not key or save (its own rules: unsafe ops, hooks)
is traced as before.
"""
import contextlib
import functools
import hashlib
import os
import threading
import time

import torch
from torch._inductor.output_code import OutputCode

from . import _stats
from . import recipe

ENTRY_VERSION = 5               # bump when what an entry means to tccd changes

_current = threading.local()    # .cfg, .tag, .key of the tccd compile in progress
_make_graph = None              # the graph factory (set_graph_factory)


def set_graph_factory(make_graph):
    """Hands in what a loaded entry becomes: make_graph(gm, kind, cfg,
    dynamic, fullgraph, fresh_copy=, load_source=, saved_recipe=,
    recipe_path=) returns the graph AOTAutograd calls. dynamo.py hands in
    its _CompiledGraph when it is imported."""
    global _make_graph
    _make_graph = make_graph


class TccdOutputCode(OutputCode):
    """One AOTAutograd graph (forward, backward or inference) for tccd:
    calls its _CompiledGraph (boxed), pickles as the graph alone."""

    def __init__(self, graph):
        super().__init__()
        self._boxed_call = True
        self.graph = graph          # the _CompiledGraph (None while serialized)
        self.kind = graph.kind
        self.dynamic = graph.dynamic
        self.fullgraph = graph.fullgraph
        self.channels_last_outputs = graph.channels_last_outputs   # see _CompiledGraph
        self.blob = None            # GraphPickler bytes of graph.source_gm
        self.light = None           # a blob without the nodes' values: its inputs' layouts
        self.from_plan = None       # (recipe, source loader) of a daemon's plan (plan.py)

    @classmethod
    def of_plan(cls, kind, dynamic, fullgraph, saved_recipe, load_source):
        """The OutputCode of graph `kind` of a daemon's plan (plan.py):
        set up from its recipe; its source graph built from the plan only
        should it have to be partitioned again. Never serialized."""
        self = cls.__new__(cls)
        OutputCode.__init__(self)
        self._boxed_call = True
        self.graph = None
        self.kind, self.dynamic, self.fullgraph = kind, dynamic, fullgraph
        self.blob = self.light = None
        self.from_plan = (saved_recipe, load_source)
        return self

    def __call__(self, inputs):
        graph = self.graph
        forward = graph.forward
        if forward is None:
            return graph(inputs)
        try:
            return forward(*inputs)
        except recipe.Unforeseen as e:
            return graph._unforeseen(e, forward, inputs)

    def prepare_for_serialization(self):
        from torch.fx._graph_pickler import GraphPickler, Options

        if getattr(self, "from_plan", None) is not None:
            raise RuntimeError("tccd: a graph set up from the daemon's plan is not serialized")
        if self.blob is None and self.graph is not None:
            # Of the nodes' metadata tccd reads only the traced values
            # (stack traces and provenance would double the entry), and a
            # CPU graph of static shapes not even those (see the top).
            t0 = time.perf_counter()
            gm = self.graph.source_gm
            full = os.environ.get("TCCD_AOT_FULL_VALUES", "") not in ("", "0")  # benchmarks' other road
            self.light = _input_layouts(gm) if self.graph.device == "cpu" and not full else None
            keep = (lambda key: False) if self.light is not None else (lambda key: key == "val")
            self.blob = GraphPickler.dumps(gm, options=Options(node_metadata_key_filter=keep))
            _stats.add(aot_save_seconds=time.perf_counter() - t0)
        self.graph = None

    def post_compile(self, example_inputs, constants, graph_kwargs):
        if self.graph is not None:
            return
        from torch._guards import detect_fake_mode
        from torch._subclasses import FakeTensorMode
        from torch.fx._graph_pickler import GraphPickler

        from .config import Config

        if _make_graph is None:
            raise RuntimeError("tccd.aot_cache: no graph factory "
                               "(tccd.dynamo hands it in when imported)")
        cfg = getattr(_current, "cfg", None) or Config.make()
        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode()

        light = getattr(self, "light", None)
        from_plan = getattr(self, "from_plan", None)

        def load():
            if from_plan is not None:
                gm, light_ = from_plan[1]()
                _derive_values(gm, light_, fake_mode)
                return gm
            gm = GraphPickler.loads(self.blob, fake_mode)
            gm.recompile()
            if light is not None:
                _derive_values(gm, light, fake_mode)
            return gm

        # The loaded graph is this process's own: the first partitioning
        # takes it as it is (no copy); a later one (after the daemon
        # refused a node) loads it again. The blob stays the entry should
        # this OutputCode be serialized again.
        if from_plan is not None:
            path, saved = None, from_plan[0]
        else:
            path = recipe_path(self.kind)
            saved = recipe.load(path) if path else None
        loaded = [] if saved else [load()]   # with a recipe, only should it fail

        def fresh_copy():
            return loaded.pop() if loaded else load()

        def first_load():
            loaded.append(load())
            return loaded[0]

        self.graph = _make_graph(loaded[0] if loaded else None, self.kind, cfg, self.dynamic,
                                 self.fullgraph, fresh_copy=fresh_copy, load_source=first_load,
                                 saved_recipe=saved, recipe_path=path,
                                 channels_last_outputs=getattr(self, "channels_last_outputs", ()))
        _stats.add(aot_cache_hits=0 if from_plan is not None else 1)

    def set_triton_bundle(self, triton_bundle):
        pass


def _input_layouts(gm):
    """The placeholders' traced values as plain data -- a tensor as
    (sizes, strides, storage offset, dtype, device), a number as itself --
    or None when one is symbolic or of another kind (the blob then keeps
    every value)."""
    out = []
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.Tensor):
            layout = (tuple(v.shape), tuple(v.stride()), v.storage_offset())
            if any(not isinstance(x, int) for x in (*layout[0], *layout[1], layout[2])):
                return None
            out.append((*layout, v.dtype, str(v.device)))
        elif isinstance(v, (int, float, bool)):
            out.append(v)
        else:
            return None
    return out


def _derive_values(gm, layouts, fake_mode):
    """node.meta["val"] of a light entry's graph, by fake propagation from
    its inputs' layouts (the same fake kernels that traced it)."""
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    ins = []
    with fake_mode:
        for x in layouts:
            if isinstance(x, tuple):
                sizes, strides, offset, dtype, device = x
                if not offset:
                    ins.append(torch.empty_strided(sizes, strides, dtype=dtype, device=device))
                    continue
                span = 1 + sum((n - 1) * st for n, st in zip(sizes, strides)) if all(sizes) else 0
                base = torch.empty(offset + span, dtype=dtype, device=device)
                ins.append(base.as_strided(sizes, strides, offset))
            else:
                ins.append(x)
    FakeTensorProp(gm, fake_mode).propagate_dont_convert_inputs(*ins)


def serializable(compile_one):
    """A tccd compiler (fx_gm, example_inputs) -> _CompiledGraph, as the
    SerializableAOTDispatchCompiler that makes AOTAutograd use its cache."""
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler

    def compile_to_output_code(fx_gm, example_inputs):
        return TccdOutputCode(compile_one(fx_gm, example_inputs))

    return SerializableAOTDispatchCompiler(TccdOutputCode, compile_to_output_code)


MAX_HASHED_CONSTANT_BYTES = 1 << 20   # a graph with a bigger constant tensor is not cached


class _KeyDetails:
    """Everything a tccd entry's key covers (pickled and hashed)."""

    def __init__(self, gm, example_inputs, aot_config, tag):
        from torch._functorch import config as functorch_config
        from torch._functorch._aot_autograd import autograd_cache as ac

        self.tag = tag
        self.torch_version = (torch.__version__, torch.version.git_version)
        self.gm = gm
        self.example_inputs = example_inputs
        self.aot_config = aot_config
        self.grad_enabled = torch.is_grad_enabled()
        self.autocast = {d: torch.get_autocast_dtype(d)
                         for d in torch._C._autocast_supported_devices()
                         if torch.is_autocast_enabled(d)}
        self.deterministic = (torch.are_deterministic_algorithms_enabled(),
                              torch.is_deterministic_algorithms_warn_only_enabled())
        self.default_dtype = torch.get_default_dtype()
        self.autograd_config = functorch_config.save_config()
        self.saved_tensors_hooks = ac._collect_saved_tensors_hooks_fx_wrap_cache_hashes(gm)
        self.sac_context_fns = ac._collect_context_fn_hashes(gm)


@functools.cache
def _key_pickler_class():
    """AOTAutogradCachePickler, with Dynamo's Sources (AOTConfig's
    aot_autograd_arg_pos_to_source: a chain per input, parameters
    included) keyed by their class and name -- the path Dynamo's guards
    read the input through -- instead of pickled field by field (BERT's
    key: 34 -> 25 ms)."""
    from torch._functorch._aot_autograd import autograd_cache as ac
    from torch._guards import Source

    class KeyPickler(ac.AOTAutogradCachePickler):
        def reducer_override(self, obj):
            if isinstance(obj, Source):
                return (ac._ident, ((type(obj).__qualname__, obj.name),))
            return super().reducer_override(obj)

    return KeyPickler


def _key_pickler(gm):
    """torch's AOTAutogradCache pickler, with tensor constants (get_attr
    tensors that are not parameters: AOTAutograd bakes them into the
    graphs) hashed by value; its own hashes their metadata only.
    Parameters stay metadata: AOTAutograd lifts them to inputs."""
    from torch._functorch._aot_autograd import autograd_cache as ac

    def reduce_constant(t):
        meta = ac.extract_tensor_metadata_for_cache_key(t)
        nbytes = t.numel() * t.element_size()
        if nbytes > MAX_HASHED_CONSTANT_BYTES:
            raise ac.BypassAOTAutogradCache(
                f"a {nbytes}-byte constant tensor (tccd hashes constants up to "
                f"{MAX_HASHED_CONSTANT_BYTES} bytes)")
        return (ac._ident, ((meta, t.detach().cpu().tolist()),))

    def reduce_parameter(t):
        return (ac._ident, (ac.extract_tensor_metadata_for_cache_key(t),))

    pickler = _key_pickler_class()(gm)
    pickler.dispatch_table[torch.Tensor] = reduce_constant
    pickler.dispatch_table[torch.nn.Parameter] = reduce_parameter
    return pickler


def cache_key(mod, example_inputs, aot_config, compiler_config_extra=None):
    """autograd_cache_key's stand-in while tccd compiles: (key, debug lines).
    Raises BypassAOTAutogradCache (or anything) for a graph it will not key;
    AOTAutogradCache then traces without the cache."""
    from torch._functorch._aot_autograd import autograd_cache as ac

    gm = mod.gm if isinstance(mod, torch._dynamo.utils.GmWrapper) else mod
    with ac.sanitize_gm_for_cache(gm):
        ac.check_cacheable(gm)
        details = _KeyDetails(gm, example_inputs, aot_config, _current.tag)
        key = "tccd" + _key_pickler(gm).get_hash(details)
    _current.key = key
    return key, []


def recipe_path(kind):
    """Where the recipe (recipe.py) of graph `kind` of the entry being
    compiled or loaded goes; None outside a keyed tccd AOTAutograd call."""
    key = getattr(_current, "key", None)
    return recipe.path_for(key, kind) if key else None


def key_tag(cfg, dynamic, fullgraph, kept_whole):
    """What goes into the key besides the graph: tccd, the entry version,
    the decomposition table (core ATen's for this torch, whose version the
    key has, less the ops tccd keeps whole: `kept_whole`), and the options
    that change the graphs tccd is given or what it makes of them (not the
    address or deadlines)."""
    kept = hashlib.sha256("\n".join(sorted(kept_whole)).encode()).hexdigest()[:16]
    mine = (f"tccd-aot-{ENTRY_VERSION} mode={cfg.mode} dynamic={dynamic} "
            f"fullgraph={fullgraph} fallback={cfg.fallback} ops={cfg.ops} cuda={cfg.cuda} "
            f"isa={cfg.cpu_isa} core-aten-less={kept}")
    if cfg.eager_guard:   # its recipes stand for kernels that beat eager here
        mine += " eager-guard"
    user = torch.compiler.config.cache_key_tag
    return f"{user}|{mine}" if user else mine


@contextlib.contextmanager
def caching(cfg, tag, dynamic=False, fullgraph=False):
    """Around one tccd AOTAutograd call with `cfg`: the cache on (bundled
    entries, the backward handed over now so it is saved with the
    forward), keyed by cache_key with `tag`; with cfg.plans, a local
    miss asks the daemon for the key's plan (plan.py), and an entry saved
    is made into a plan once its graphs have run."""
    from torch._functorch._aot_autograd import autograd_cache as ac

    _current.cfg, _current.tag, _current.key = cfg, tag, None
    _current.dynamic, _current.fullgraph = dynamic, fullgraph
    cls = ac.AOTAutogradCache
    try:
        with torch._functorch.config.patch(enable_autograd_cache=True,
                                           bundled_autograd_cache=True,
                                           force_non_lazy_backward_lowering=True), \
                _replaced(ac, "autograd_cache_key", cache_key), \
                _replaced(cls, "save", staticmethod(_saving_plan(cls.save))), \
                _replaced(cls, "try_load", staticmethod(_trying_plan(cls.try_load))):
            yield
    finally:
        _current.cfg = _current.tag = _current.key = None


def _plans_on(cfg):
    return cfg is not None and getattr(cfg, "plans", False)


def _saving_plan(save):
    """AOTAutogradCache.save, and then, with plans on, a PendingPlan for
    the entry (sent to the daemon when its graphs have run)."""
    def wrapper(key, entry, remote):
        graphs = []
        for loadable in (entry.compiled_fw, entry.compiled_bw):
            code = getattr(loadable, "result", None)
            if isinstance(code, TccdOutputCode) and code.graph is not None:
                graphs.append(code.graph)
        save(key, entry, remote)
        cfg = getattr(_current, "cfg", None)
        if _plans_on(cfg) and graphs and all(g.recipe_path for g in graphs):
            from . import plan

            plan.PendingPlan(key, entry, graphs, cfg)
    return wrapper


def _trying_plan(try_load):
    """AOTAutogradCache.try_load, and on a miss, with plans on, the
    daemon's plan of the same key (plan.py)."""
    def wrapper(mod, args, aot_config, *rest, **kw):
        # torch 2.13: (compiler_config_extra, local, remote,
        # compile_region_name=) -> (fn, aot_config); torch 2.11 (the GPU
        # machines'): (cudagraphs, boxed_forward_device_index, local,
        # remote) -> fn, and no plans there
        got = try_load(mod, args, aot_config, *rest, **kw)
        if not isinstance(got, tuple):
            return got
        fn, aot_config = got
        compiler_config_extra = rest[0] if rest else kw.get("compiler_config_extra")
        compile_region_name = kw.get("compile_region_name")
        cfg, key = getattr(_current, "cfg", None), getattr(_current, "key", None)
        if fn is not None or key is None or not _plans_on(cfg):
            return fn, aot_config
        from . import plan

        got = plan.lookup(cfg, key)
        if got is None:
            return fn, aot_config
        t0 = time.perf_counter()
        try:
            entry = _entry_of_plan(got, _current.dynamic, _current.fullgraph)
            from torch._functorch._aot_autograd.autograd_cache import create_fx_config

            fx_config = create_fx_config(compiler_config_extra, compile_region_name)
            fn = entry.wrap_post_compile(args, aot_config, fx_config)
        except Exception as e:          # noqa: BLE001 -- BadPlan, or any surprise: trace
            import logging

            logging.getLogger("tccd").log(
                logging.INFO if isinstance(e, plan.BadPlan) else logging.WARNING,
                "tccd: not using the daemon's plan for %s: %s; tracing", key, e)
            _stats.add(plan_misses=1, plans_refused=1)
            return None, aot_config
        finally:
            _stats.add(plan_load_seconds=time.perf_counter() - t0)
        _stats.add(plan_hits=1)
        return fn, aot_config
    return wrapper


def _entry_of_plan(p, dynamic, fullgraph):
    """The AOTAutograd result (a BundledAOTAutogradResult) a checked plan
    stands for. Raises plan.BadPlan."""
    from torch._functorch._aot_autograd import runtime_wrappers, schemas
    from torch._functorch._aot_autograd.aot_autograd_result import (
        BundledAOTAutogradResult, BundledCompiledBackward, BundledCompiledForward)

    from . import plan

    fields = plan.decode_value(p.result)
    training = p.HasField("backward")
    want = set(plan._RESULT_FIELDS)
    if training:
        want |= {"backward_state_indices", "num_symints_saved_for_bw"}
    if type(fields) is not dict or set(fields) != want:
        raise plan.BadPlan("an AOTAutograd result of other fields")
    ints = ["num_fw_outs_saved_for_bw", "forward_time_taken_ns", "backward_time_taken_ns"]
    if training:
        ints.append("num_symints_saved_for_bw")
    lists = ["indices_of_inps_to_detach"] + (["backward_state_indices"] if training else [])
    if not isinstance(fields["runtime_metadata"], schemas.ViewAndMutationMeta) \
            or not isinstance(fields["sanitized_aot_config"], schemas.CacheableAOTConfig) \
            or type(fields["dispatch_wrappers"]) is not list \
            or not all(isinstance(w, (runtime_wrappers.AOTDedupeWrapper,
                                      runtime_wrappers.AOTSyntheticBaseWrapper))
                       for w in fields["dispatch_wrappers"]) \
            or not all(fields[k] is None or type(fields[k]) is int for k in ints) \
            or not all(type(fields[k]) is list and all(type(i) is int for i in fields[k])
                       for k in lists):
        raise plan.BadPlan("an AOTAutograd result whose fields are of other types")
    kinds = ("forward", "backward") if training else ("inference",)
    if p.forward.kind != kinds[0] or (training and p.backward.kind != "backward"):
        raise plan.BadPlan("graphs of other kinds than the result has")
    codes = [TccdOutputCode.of_plan(part.kind, dynamic, fullgraph, *plan.decode_part(part))
             for part in ([p.forward, p.backward] if training else [p.forward])]
    bw = None
    if training:
        bw = BundledCompiledBackward(codes[1], fields["backward_state_indices"],
                                     fields["num_symints_saved_for_bw"])
    return BundledAOTAutogradResult(
        compiled_fw=BundledCompiledForward(codes[0]), compiled_bw=bw,
        aot_joint_graph_str=None, aot_forward_graph_str=None, aot_backward_graph_str=None,
        min_cut_info_str=None, runtime_metadata=fields["runtime_metadata"],
        dispatch_wrappers=fields["dispatch_wrappers"], maybe_subclass_meta=None,
        num_fw_outs_saved_for_bw=fields["num_fw_outs_saved_for_bw"],
        indices_of_inps_to_detach=fields["indices_of_inps_to_detach"],
        forward_time_taken_ns=fields["forward_time_taken_ns"],
        backward_time_taken_ns=fields["backward_time_taken_ns"],
        sanitized_aot_config=fields["sanitized_aot_config"], guards_expr=None,
        serialized_bw_module=None)


@contextlib.contextmanager
def _replaced(module, name, value):
    """module.name is `value` inside the block (Dynamo compiles one frame
    at a time, so no other compile sees it)."""
    saved = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, saved)
