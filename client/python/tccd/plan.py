"""Plans: a graph's AOTAutograd result and partitioning, kept by the daemon
so that a process on any node starts as warm as on the node that compiled.

A warm process on the node that compiled loads AOTAutograd's result from
torch's AOTAutogradCache and each graph's recipe (recipe.py) from its
local directory; a process on another node has neither and traces again.
A plan (tcc.v1.Plan) carries the same things as data:

  result      the AOTAutograd result less its compiled graphs: the runtime
              metadata (ViewAndMutationMeta), the dispatch wrappers, the
              backward's indices -- dataclasses of an allow-list, field by
              field (encode_value / decode_value)
  forward,    per graph AOTAutograd hands its compiler: the graph as given
  backward    (nodes, ATen operators by name, placeholders' layouts; for
              partitioning again should the plan not serve), the top
              level as tccd partitioned it (partition calls, getitems,
              eager ATen ops, constants), and per partition its constants,
              output steps and the CompileRequest of each kernel

It is made once every graph of an AOTAutograd entry the process compiled
has run its first call (PendingPlan; encoded and sent on a thread of its
own, `flush` waits for it), and handed to the daemon (PutPlan),
which checks that each request names a kernel it compiled, keeps the
plan in its store and the remote tier, and signs it; a client cannot
write the store any other way. A process whose AOTAutogradCache misses
asks the daemon for the plan of the same key (lookup; the key names no
host, path, rank or device index), verifies its signature in
libtccclient (with trusted keys), checks every field here -- operators
and classes against allow-lists, tensors against their byte counts, the
torch version and this package's source hash -- and builds the
AOTAutograd result and the graphs' recipes from it. Code runs only as FX
generates it from the checked graph. A plan it cannot use is logged at
TORCH_LOGS=tccd with the reason, and the graph is traced as before.

CPU graphs of static shapes only, like recipes; a graph with symbolic
shapes, tensor subclasses or compiled autograd is not planned.
"""
import atexit
import collections
import dataclasses
import enum
import functools
import keyword
import logging
import math
import operator
import os
import re
import threading
import time

import torch

from . import _stats
from . import recipe
from ._proto import tcc_pb2 as pb

log = logging.getLogger("tccd")

FORMAT = 1
MAX_TENSOR_BYTES = 1 << 20          # a constant in a plan (as aot_cache hashes them)
MAX_DEPTH = 64                      # nesting of values


class Unplannable(Exception):
    """Something a plan cannot express (the entry is kept locally only)."""


class BadPlan(Exception):
    """A plan this process will not use: the reason."""


# ------------------------------------------------------------ allow-lists

@functools.cache
def _classes():
    """name -> class of the objects a plan's result may hold."""
    from torch._functorch._aot_autograd import descriptors, runtime_wrappers, schemas

    classes = [schemas.ViewAndMutationMeta, schemas.InputAliasInfo, schemas.OutputAliasInfo,
               schemas.PlainTensorMeta, schemas.MemoryFormatMeta, schemas.CacheableAOTConfig,
               runtime_wrappers.AOTDedupeWrapper, runtime_wrappers.AOTSyntheticBaseWrapper]
    for v in vars(descriptors).values():
        if isinstance(v, type) and dataclasses.is_dataclass(v) and \
                issubclass(v, (descriptors.AOTInput, descriptors.AOTOutput)):
            classes.append(v)
    out = {}
    for c in classes:
        assert c.__qualname__ not in out, c
        out[c.__qualname__] = c
    return out


@functools.cache
def _enums():
    from torch._functorch._aot_autograd import schemas

    return {c.__qualname__: c for c in (schemas.OutputType, schemas.MutationType)}


@functools.cache
def _type_refs():
    from torch._subclasses.functional_tensor import FunctionalTensor

    return {c.__qualname__: c for c in (torch.Tensor, torch.nn.Parameter, FunctionalTensor,
                                        int, float, bool, torch.SymInt, torch.SymFloat,
                                        torch.SymBool)}


_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128)}
_LAYOUTS = {"strided": torch.strided}
_MEMORY_FORMATS = {str(m).removeprefix("torch."): m for m in (
    torch.contiguous_format, torch.channels_last, torch.preserve_format,
    torch.channels_last_3d)}
_NAMED = {"dtype": _DTYPES, "layout": _LAYOUTS, "memory_format": _MEMORY_FORMATS,
          "device": {"cpu": torch.device("cpu")}}   # PlanValue kinds named from a table
_OPERATOR_FUNCS = {f"_operator.{f.__name__}": f for f in (
    operator.getitem, operator.add, operator.sub, operator.mul, operator.floordiv,
    operator.truediv, operator.mod, operator.neg, operator.pow, operator.eq, operator.ne,
    operator.lt, operator.le, operator.gt, operator.ge)}
_OP_NAMESPACES = ("aten", "prims")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


def op_name(target):
    """A call_function target's name in a plan; raises Unplannable."""
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        if ns in _OP_NAMESPACES:
            return f"{ns}::{target._schema.name.split('::', 1)[1]}.{target._overloadname}"
    name = f"{getattr(target, '__module__', '')}.{getattr(target, '__name__', '')}"
    if _OPERATOR_FUNCS.get(name) is target:
        return name
    raise Unplannable(f"operator {target} is not one a plan can name")


def op_named(name):
    """The operator a plan names; raises BadPlan for one off the allow-list."""
    f = _OPERATOR_FUNCS.get(name)
    if f is not None:
        return f
    m = re.fullmatch(r"([a-z_]+)::([A-Za-z0-9_]+)\.([A-Za-z0-9_]+)", name)
    if not m or m.group(1) not in _OP_NAMESPACES:
        raise BadPlan(f"operator {name!r} is not on the allow-list")
    try:
        op = getattr(getattr(getattr(torch.ops, m.group(1)), m.group(2)), m.group(3))
    except (AttributeError, RuntimeError):
        raise BadPlan(f"operator {name!r} does not exist in this torch") from None
    if not isinstance(op, torch._ops.OpOverload):
        raise BadPlan(f"{name!r} is not an operator overload")
    return op


def identifier(name, what):
    """name, when it is a plain identifier FX can emit; raises BadPlan."""
    if not isinstance(name, str) or not _NAME.match(name) or keyword.iskeyword(name) \
            or name.startswith("__"):
        raise BadPlan(f"{what} {name!r} is not a plain identifier")
    return name


# ------------------------------------------------------------ values

def encode_tensor(t):
    t = t.detach()
    if t.device.type != "cpu":
        raise Unplannable("a constant tensor not on the CPU")
    dtype = str(t.dtype).removeprefix("torch.")
    if dtype not in _DTYPES:
        raise Unplannable(f"a {t.dtype} constant")
    nbytes = t.numel() * t.element_size()
    if nbytes > MAX_TENSOR_BYTES:
        raise Unplannable(f"a {nbytes}-byte constant")
    flat = t.contiguous().reshape(-1)
    data = flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""
    return pb.PlanTensor(dtype=dtype, sizes=list(t.shape), strides=list(t.stride()),
                         storage_offset=0, data=data)


def decode_tensor(m):
    dtype = _DTYPES.get(m.dtype)
    if dtype is None:
        raise BadPlan(f"tensor dtype {m.dtype!r}")
    sizes, strides = list(m.sizes), list(m.strides)
    if len(sizes) != len(strides) or any(s < 0 for s in sizes) or any(s < 0 for s in strides) \
            or m.storage_offset != 0:
        raise BadPlan("a tensor's layout is not one a plan writes")
    numel = math.prod(sizes)
    esize = torch.empty((), dtype=dtype).element_size()
    if len(m.data) != numel * esize or len(m.data) > MAX_TENSOR_BYTES:
        raise BadPlan(f"a tensor of {numel} {m.dtype} elements carries {len(m.data)} bytes")
    flat = torch.frombuffer(bytearray(m.data), dtype=torch.uint8).view(dtype) if numel else \
        torch.empty(0, dtype=dtype)
    dense = flat.reshape(sizes)
    if numel and tuple(dense.stride()) != tuple(strides):
        out = torch.empty_strided(sizes, strides, dtype=dtype)
        out.copy_(dense)
        return out
    return dense.as_strided(sizes, strides) if numel == 0 else dense


def encode_value(v, nodes=None, depth=0):
    """v as a PlanValue; nodes: fx Node -> index (graph arguments).
    Raises Unplannable."""
    if depth > MAX_DEPTH:
        raise Unplannable("a value nested too deep")
    P = pb.PlanValue
    if v is None:
        return P(none=True)
    if isinstance(v, bool):
        return P(boolean=v)
    if isinstance(v, enum.Enum):
        name = type(v).__qualname__
        if _enums().get(name) is not type(v):
            raise Unplannable(f"enum {name}")
        return P(enum_member=f"{name}.{v.name}")
    if isinstance(v, int):
        if not -(1 << 63) <= v < (1 << 63):
            raise Unplannable("an integer beyond 64 bits")
        return P(integer=v)
    if isinstance(v, float):
        return P(real=v)
    if isinstance(v, str):
        return P(text=v)
    if isinstance(v, bytes):
        return P(raw=v)
    if isinstance(v, torch.dtype):
        return P(dtype=str(v).removeprefix("torch."))
    if isinstance(v, torch.device):
        if v.type != "cpu":
            raise Unplannable(f"device {v}")
        return P(device="cpu")
    if isinstance(v, torch.layout):
        if v is not torch.strided:
            raise Unplannable(f"layout {v}")
        return P(layout="strided")
    if isinstance(v, torch.memory_format):
        return P(memory_format=str(v).removeprefix("torch."))
    if isinstance(v, torch.Tensor):
        return P(tensor=encode_tensor(v))
    if nodes is not None and isinstance(v, torch.fx.Node):
        return P(node=nodes[v])
    if isinstance(v, type):
        if _type_refs().get(v.__qualname__) is not v:
            raise Unplannable(f"class {v.__qualname__}")
        return P(type_ref=v.__qualname__)

    def items(xs):
        return pb.PlanValues(items=[encode_value(x, nodes, depth + 1) for x in xs])

    if isinstance(v, torch.Size):
        return P(size=items(v))
    if isinstance(v, tuple) and type(v) is tuple:
        return P(tuple=items(v))
    if type(v) is list or type(v) is torch.fx.immutable_collections.immutable_list:
        return P(list=items(v))
    if type(v) in (set, frozenset):
        return P(set=items(sorted(v, key=repr)))
    if type(v) in (dict, collections.OrderedDict, collections.defaultdict,
                   torch.fx.immutable_collections.immutable_dict):
        factory = ""
        if type(v) is collections.defaultdict:
            if v.default_factory is not list:
                raise Unplannable("a defaultdict of something other than lists")
            factory = "list"
        return P(dict=pb.PlanDict(keys=[encode_value(k, nodes, depth + 1) for k in v],
                                  values=[encode_value(x, nodes, depth + 1) for x in v.values()],
                                  default_factory=factory))
    name = type(v).__qualname__
    if _classes().get(name) is type(v):
        # (cached properties are derived again when read)
        return P(object=pb.PlanObject(type=name, fields=[
            pb.PlanField(name=k, value=encode_value(x, nodes, depth + 1))
            for k, x in vars(v).items()
            if not isinstance(getattr(type(v), k, None), functools.cached_property)]))
    raise Unplannable(f"a value of type {type(v).__module__}.{name}")


def decode_value(m, nodes=None, depth=0):
    """The value a PlanValue stands for; nodes: index -> fx Node. Raises
    BadPlan for anything off the allow-lists."""
    if depth > MAX_DEPTH:
        raise BadPlan("a value nested too deep")
    which = m.WhichOneof("v")
    if which is None:
        raise BadPlan("a value of no kind (written by a newer tccd?)")
    x = getattr(m, which)

    def items():
        return [decode_value(i, nodes, depth + 1) for i in x.items]

    if which == "none":
        return None
    if which in ("boolean", "integer", "real", "text", "raw"):
        return x
    if which == "list":
        return items()
    if which == "tuple":
        return tuple(items())
    if which == "size":
        vals = items()
        if not all(type(i) is int for i in vals):
            raise BadPlan("a size of non-integers")
        return torch.Size(vals)
    if which == "set":
        vals = items()
        try:
            return set(vals)
        except TypeError:
            raise BadPlan("a set of unhashable values") from None
    if which == "dict":
        if len(x.keys) != len(x.values):
            raise BadPlan("a dict with as many keys as values it has not")
        if x.default_factory not in ("", "list"):
            raise BadPlan(f"a defaultdict of {x.default_factory!r}")
        out = collections.defaultdict(list) if x.default_factory else {}
        for k, v in zip(x.keys, x.values):
            key = decode_value(k, nodes, depth + 1)
            try:
                out[key] = decode_value(v, nodes, depth + 1)
            except TypeError:
                raise BadPlan("a dict key that is not hashable") from None
        return out
    if which == "enum_member":
        cls_name, _, member = x.rpartition(".")
        cls = _enums().get(cls_name)
        if cls is None or member not in cls.__members__:
            raise BadPlan(f"enum member {x!r}")
        return cls[member]
    if which in _NAMED:
        named = _NAMED[which]
        if x not in named:
            raise BadPlan(f"{which} {x!r}")
        return named[x]
    if which == "tensor":
        return decode_tensor(x)
    if which == "node":
        if nodes is None or not 0 <= x < len(nodes):
            raise BadPlan(f"node {x} outside the graph's earlier nodes")
        return nodes[x]
    if which == "op":
        raise BadPlan(f"operator {x!r} as a value (operators are node targets only)")
    if which == "type_ref":
        cls = _type_refs().get(x)
        if cls is None:
            raise BadPlan(f"class {x!r}")
        return cls
    if which == "object":
        cls = _classes().get(x.type)
        if cls is None:
            raise BadPlan(f"an object of type {x.type!r}, not on the allow-list")
        names = [f.name for f in x.fields]
        declared = {f.name for f in dataclasses.fields(cls)}
        if len(set(names)) != len(names) or not declared <= set(names):
            raise BadPlan(f"a {x.type} without its fields "
                          f"({', '.join(sorted(declared - set(names)))} missing)")
        for n in names:
            # a declared field, or an attribute its __post_init__ sets; never
            # one that would shadow something of the class (a method)
            if not _NAME.match(n) or n.startswith("__") or \
                    (n not in declared and hasattr(cls, n)):
                raise BadPlan(f"a {x.type} with attribute {n!r}")
        obj = cls.__new__(cls)
        for f in x.fields:
            object.__setattr__(obj, f.name, decode_value(f.value, nodes, depth + 1))
        return obj
    raise BadPlan(f"a value of kind {which!r}")


# ------------------------------------------------------------ graphs

def encode_graph(gm, with_values):
    """gm's graph as a PlanGraph. with_values: placeholders carry their
    traced layouts (a graph AOTAutograd gave, to be partitioned again).
    Raises Unplannable."""
    from .aot_cache import _input_layouts

    layouts = _input_layouts(gm) if with_values else None
    if with_values and layouts is None:
        raise Unplannable("symbolic or unusual inputs")
    index = {}
    out = pb.PlanGraph()
    i_ph = 0
    for n in gm.graph.nodes:
        node = pb.PlanNode(op=n.op, name=n.name)
        if n.op == "call_function":
            node.target = op_name(n.target)
        elif n.op == "call_module":
            node.target = identifier(n.target, "partition")
        elif n.op == "get_attr":
            node.target = identifier(n.target, "constant")
            t = getattr(gm, n.target)
            if not isinstance(t, torch.Tensor) or t.requires_grad:
                raise Unplannable(f"attribute {n.target} is not a constant tensor")
            out.constants.append(pb.PlanField(name=n.target, value=encode_value(t)))
        elif n.op == "placeholder":
            if layouts is not None:
                node.value.CopyFrom(encode_value(layouts[i_ph]))
            i_ph += 1
        elif n.op != "output":
            raise Unplannable(f"a {n.op} node")
        node.args.CopyFrom(encode_value(tuple(n.args), index))
        node.kwargs.CopyFrom(encode_value(dict(n.kwargs), index))
        index[n] = len(index)
        out.nodes.append(node)
    return out


def decode_graph(m, partitions=()):
    """(fx Graph, constants {name: tensor}, placeholder values) of a
    PlanGraph; call_module targets must be among `partitions`. Raises
    BadPlan."""
    g = torch.fx.Graph()
    constants = {}
    for c in m.constants:
        name = identifier(c.name, "constant")
        if name in constants:
            raise BadPlan(f"constant {name} given twice")
        t = decode_value(c.value)
        if not isinstance(t, torch.Tensor):
            raise BadPlan(f"constant {name} is not a tensor")
        constants[name] = t
    nodes, values, outputs = [], [], 0
    for pn in m.nodes:
        args = decode_value(pn.args, nodes)
        kwargs = decode_value(pn.kwargs, nodes)
        if type(args) is not tuple or type(kwargs) is not dict or \
                not all(isinstance(k, str) and _NAME.match(k) for k in kwargs):
            raise BadPlan(f"node {pn.name!r}: arguments not a tuple and a dict of names")
        if pn.op == "placeholder":
            if args or kwargs:
                raise BadPlan("a placeholder with arguments")
            n = g.placeholder(identifier(pn.name, "placeholder"))
            values.append(decode_value(pn.value) if pn.HasField("value") else None)
        elif pn.op == "call_function":
            n = g.call_function(op_named(pn.target), args, kwargs)
        elif pn.op == "call_module":
            if pn.target not in partitions:
                raise BadPlan(f"a call of {pn.target!r}, which is no partition of the plan")
            n = g.call_module(pn.target, args, kwargs)
        elif pn.op == "get_attr":
            if pn.target not in constants:
                raise BadPlan(f"get_attr of {pn.target!r}, which is no constant of the plan")
            n = g.get_attr(pn.target)
        elif pn.op == "output":
            if len(args) != 1 or kwargs:
                raise BadPlan("an output node of another form")
            n = g.output(args[0])
            outputs += 1
        else:
            raise BadPlan(f"a node of kind {pn.op!r}")
        nodes.append(n)
    if outputs != 1 or nodes[-1].op != "output":
        raise BadPlan("a graph without one output node at its end")
    return g, constants, values


def graph_module(m):
    """The GraphModule a PlanGraph of a source graph describes, its
    placeholders' traced values derived again by fake propagation (as a
    light AOTAutogradCache entry's are)."""
    g, constants, values = decode_graph(m)
    root = torch.nn.Module()
    for name, t in constants.items():
        setattr(root, name, t)
    gm = torch.fx.GraphModule(root, g)
    if any(v is None for v in values):
        raise BadPlan("a source graph's placeholder without its layout")
    return gm, values


# ------------------------------------------------------------ making a plan

def encode_part(kind, source_gm, saved_recipe, top_gm):
    """One graph's PlanGraphPart from its source graph, the recipe its
    _CompiledGraph captured (dynamo._capture_recipe) and the partitioned
    top level. Raises Unplannable."""
    part = pb.PlanGraphPart(kind=kind)
    part.source.CopyFrom(encode_graph(source_gm, with_values=True))
    part.partitioned.CopyFrom(encode_graph(top_gm, with_values=False))
    for sp in saved_recipe["partitions"]:
        pp = part.partitions.add(name=identifier(sp["name"], "partition"), ops=sp["n_ops"],
                                 has_kernel=sp["has_kernel"])
        pp.constants.CopyFrom(encode_value(dict(sp["constants"])))
        pp.assembly.CopyFrom(encode_value(sp["assembly"].__getstate__()))
        for key, request, seeds, n_outputs in sp["kernels"]:
            k = pp.kernels.add(seeds=seeds, outputs=n_outputs)
            k.signature.CopyFrom(encode_value(key))
            k.request.ParseFromString(request)
            k.request.client = ""
    part.record.CopyFrom(encode_value(saved_recipe["record"]))
    return part


_RESULT_FIELDS = ("runtime_metadata", "dispatch_wrappers", "num_fw_outs_saved_for_bw",
                  "indices_of_inps_to_detach", "forward_time_taken_ns", "backward_time_taken_ns",
                  "sanitized_aot_config")


def encode_result(entry):
    """The AOTAutograd result's fields a plan keeps, as a PlanValue dict.
    Raises Unplannable for what a plan does not carry."""
    if entry.maybe_subclass_meta is not None:
        raise Unplannable("tensor subclasses")
    if entry.guards_expr:
        raise Unplannable("shape guards")
    fields = {k: getattr(entry, k) for k in _RESULT_FIELDS}
    # Dynamo's Sources name where each input came from: debugging output
    # only (a hit uses the calling process's own AOTConfig).
    fields["sanitized_aot_config"] = dataclasses.replace(entry.sanitized_aot_config,
                                                         aot_autograd_arg_pos_to_source=None,
                                                         precompile_backend_id=None)
    if entry.compiled_bw is not None:
        fields["backward_state_indices"] = list(entry.compiled_bw.backward_state_indices)
        fields["num_symints_saved_for_bw"] = entry.compiled_bw.num_symints_saved_for_bw_
    return encode_value(fields)


_senders = []                      # threads sending plans (flush)
_senders_lock = threading.Lock()


def flush(timeout=None):
    """Waits for the plans being made and sent in the background (at most
    `timeout` seconds in all; None: as long as it takes). Returns whether
    none is left. Runs at exit too (at most EXIT_WAIT_S), so a short job
    still leaves its plans."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        with _senders_lock:
            _senders[:] = [t for t in _senders if t.is_alive()]
            left = list(_senders)
        if not left:
            return True
        for t in left:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        if deadline is not None and time.monotonic() >= deadline:
            with _senders_lock:
                return not any(t.is_alive() for t in _senders)


# A daemon thread, waited for at exit at most this long: a job whose
# daemon hangs does not hang in turn (the plan is then not sent).
EXIT_WAIT_S = 10.0
atexit.register(flush, EXIT_WAIT_S)


# The sending thread's nice value. Encoding a training graph's plan takes
# up to about a second of CPU (0.4 s for BERT-base, 0.8 s for DenseNet-121
# training), right when the job's steps start, beside the kernels' OpenMP
# threads; niced, it gets what the job leaves.
PLAN_THREAD_NICE = 19


def _lower_this_thread():
    """Lowers the calling thread's scheduling priority (Linux: a thread
    id given to setpriority names that thread only); best effort."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), PLAN_THREAD_NICE)
    except (AttributeError, OSError):
        pass


class PendingPlan:
    """A plan waiting for the first calls of its graphs: made of the
    AOTAutograd entry when it is saved and of each graph's recipe
    (graph_ready); once every graph has one, it is encoded and sent to the
    daemon on a thread of its own, off the job's first call (0.4 s of a
    BERT-base training step's)."""

    def __init__(self, key, entry, graphs, cfg):
        self.key = key
        self.cfg = cfg
        self.entry = entry
        self.kinds = [g.kind for g in graphs]
        self.ready = {}                 # kind -> (source graph, recipe, partitioned graph)
        self.lock = threading.Lock()
        self.done = False
        for g in graphs:
            g.plan = self

    def _give_up(self, why):
        self.done = True
        log.info("tccd: no plan for AOTAutograd entry %s: %s", self.key, why)

    def graph_ready(self, graph, saved_recipe):
        """graph (a _CompiledGraph of this entry) captured saved_recipe
        (None: it could not)."""
        with self.lock:
            if self.done:
                return
            if saved_recipe is None:
                return self._give_up(f"graph {graph.id} ({graph.kind}) keeps no recipe")
            self.ready[graph.kind] = (graph.source_gm, saved_recipe, graph.gm)
            if set(self.ready) != set(self.kinds):
                return
            self.done = True            # sent once
        t = threading.Thread(target=self._send, name=f"tccd-plan-{self.key[:16]}", daemon=True)
        with _senders_lock:
            _senders.append(t)
        t.start()

    def _send(self):
        from .dynamo import client_for
        from .errors import TccdError

        _lower_this_thread()
        t0 = time.perf_counter()
        try:
            plan = pb.Plan(format=FORMAT, key=self.key, torch_version=_torch_version(),
                           package=recipe.package_hash(), result=encode_result(self.entry))
            parts = {kind: encode_part(kind, *got) for kind, got in self.ready.items()}
            plan.forward.CopyFrom(parts.get("forward") or parts["inference"])
            if "backward" in parts:
                plan.backward.CopyFrom(parts["backward"])
        except Exception as e:          # noqa: BLE001 -- Unplannable, or a surprise: no plan
            _stats.add(plan_save_seconds=time.perf_counter() - t0)
            if not isinstance(e, Unplannable):
                log.warning("tccd: no plan for AOTAutograd entry %s: %r", self.key, e)
                return
            return self._give_up(e)
        finally:
            self.entry = self.ready = None
        try:
            stored = client_for(self.cfg).put_plan(plan)
        except Exception as e:          # noqa: BLE001 -- a plan is never worth a failed call
            level = logging.INFO if isinstance(e, TccdError) else logging.WARNING
            log.log(level, "tccd: the daemon did not keep the plan of %s: %s", self.key, e)
            return
        finally:
            _stats.add(plan_save_seconds=time.perf_counter() - t0)
        _stats.add(plans_sent=1)
        log.debug("tccd: plan of %s sent (%d bytes, %s)", self.key, plan.ByteSize(),
                  "stored" if stored else "one was kept already")


def _torch_version():
    return f"{torch.__version__} {torch.version.git_version}"


# ------------------------------------------------------------ using a plan

def lookup(cfg, key):
    """The daemon's plan for AOTAutograd key `key`, checked (check), or
    None: none kept, or one this process cannot use (logged with why)."""
    from .dynamo import client_for
    from .errors import TccdError

    t0 = time.perf_counter()
    try:
        got = client_for(cfg).get_plan(key)
    except Exception as e:              # noqa: BLE001 -- tracing is always the way back
        level = logging.INFO if isinstance(e, TccdError) else logging.WARNING
        log.log(level, "tccd: no plan for %s from the daemon: %s", key, e)
        _stats.add(plan_misses=1)
        return None
    if got is None:
        _stats.add(plan_misses=1)
        return None
    data, _status = got
    try:
        plan = check(data, key)
    except BadPlan as e:
        log.info("tccd: not using the daemon's plan for %s: %s; tracing", key, e)
        _stats.add(plan_misses=1, plans_refused=1)
        return None
    finally:
        _stats.add(plan_load_seconds=time.perf_counter() - t0)
    return plan


def check(data, key):
    """The Plan in `data`, if this process can use it; raises BadPlan."""
    plan = pb.Plan()
    try:
        plan.ParseFromString(data)
    except Exception as e:              # noqa: BLE001 -- DecodeError and friends
        raise BadPlan(f"not a tcc.v1.Plan ({e})") from None
    size = plan.ByteSize()
    plan.DiscardUnknownFields()
    if plan.ByteSize() != size:
        raise BadPlan("fields this tccd does not know (written by a newer one)")
    if plan.format != FORMAT:
        raise BadPlan(f"format {plan.format} (this tccd reads {FORMAT})")
    if plan.key != key:
        raise BadPlan(f"it is the plan of {plan.key!r}")
    if plan.torch_version != _torch_version():
        raise BadPlan(f"written with torch {plan.torch_version}, this is {_torch_version()}")
    if plan.package != recipe.package_hash():
        raise BadPlan("written by another version of the tccd package")
    if not plan.HasField("forward"):
        raise BadPlan("no forward graph")
    return plan


def decode_part(part):
    """A PlanGraphPart as (recipe dict for dynamo's _setup_from_recipe, a
    loader of its source graph). Raises BadPlan."""
    from .partition import OutputAssembly

    partitions = []
    for pp in part.partitions:
        name = identifier(pp.name, "partition")
        constants = decode_value(pp.constants)
        if type(constants) is not dict or not all(
                type(k) is int and isinstance(v, torch.Tensor) for k, v in constants.items()):
            raise BadPlan(f"partition {name}: constants are not tensors by input index")
        state = decode_value(pp.assembly)
        assembly = OutputAssembly.__new__(OutputAssembly)
        _check_assembly(name, state)
        try:
            assembly.__setstate__(state)
        except (AttributeError, RuntimeError, ValueError) as e:
            raise BadPlan(f"partition {name}: output steps ({e})") from None
        kernels = []
        for k in pp.kernels:
            if not k.HasField("request"):
                raise BadPlan(f"partition {name}: a kernel without its request")
            sig = decode_value(k.signature)
            kernels.append((sig, k.request.SerializeToString(), k.seeds, k.outputs))
        partitions.append(dict(name=name, n_ops=pp.ops, constants=constants, assembly=assembly,
                               has_kernel=pp.has_kernel, kernels=kernels))
    names = {p["name"] for p in partitions}
    if len(names) != len(partitions):
        raise BadPlan("two partitions of one name")
    g, attrs, _ = decode_graph(part.partitioned, names)
    code = g.python_code(root_module="self")
    globs = {n: (("module", v.__name__) if isinstance(v, type(torch)) else ("value", v))
             for n, v in code.globals.items()}
    record = decode_value(part.record)
    if type(record) is not dict or not isinstance(record.get("ops"), int):
        raise BadPlan("a graph record without its op count")
    saved = dict(source=code.src, globals=globs, attrs=attrs, partitions=partitions,
                 record=record, origin="plan")
    return saved, lambda: graph_module(part.source)


def _check_assembly(name, state):
    """An OutputAssembly state as __getstate__ writes it, its view ops
    on the allow-list (aten, by their dotted names)."""
    if type(state) is not dict or set(state) != {"steps", "trivial", "n_views", "saved"}:
        raise BadPlan(f"partition {name}: output steps of another form")
    for s in state["steps"]:
        if type(s) is not tuple or not s or s[0] not in ("kernel", "view"):
            raise BadPlan(f"partition {name}: an output step of another form")
        if s[0] == "view":
            for op, _args, _kwargs in s[2]:
                if not isinstance(op, str) or not op.startswith("aten."):
                    raise BadPlan(f"partition {name}: view op {op!r}")
                ns, _, rest = op.partition(".")
                op_named(f"{ns}::{rest}")
