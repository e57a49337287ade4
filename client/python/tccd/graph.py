"""FX graph (ATen level) -> tcc.v1.CompileRequest.

A partition of an AOTAutograd graph is a small torch.fx.GraphModule whose
placeholders are tensors and whose nodes call ATen overloads. It becomes a
tcc.v1.Graph for one *input signature* (each input's dtype, sizes,
strides, storage offset): the metadata of every intermediate value comes
from running the partition on fake tensors with exactly those inputs, so
the same partition can be compiled again for other layouts or sizes
(dynamic shapes) without tracing anything twice.

Mapping (see proto/tcc/v1/tcc.proto):
  placeholder            -> Graph.inputs + TensorValue (the caller's layout)
  constant tensor        -> Graph.constants (raw little-endian bytes,
                            contiguous) + TensorValue
  call_function OpOverload -> Node(target="aten.<op>.<overload>"),
                            arguments bound by their schema names:
                            Node (tensor)  -> as_tensor
                            bool/int/float -> as_bool/as_int/as_float
                            None           -> as_none
                            int/float/bool/Tensor lists -> as_ints/...
                            torch.dtype    -> as_dtype, torch.device -> as_device
                            layout=strided / memory_format -> left out
                            (each value's layout is explicit)
                            a Python number where the schema wants a
                            Tensor (aten.mul.Tensor(x, 2)) -> the op's
                            ".Scalar" overload when it has one
  getitem(node, i)       -> the i-th output name of a multi-output node
  output                 -> Graph.outputs; their layout is the fake
                            tensor's when dense, else contiguous

Anything that has no faithful encoding raises Unsupported (a SymInt
argument, a layout/memory format, an unknown dtype); the partitioner asks
`check_node` first, so such nodes run eagerly instead.
"""
import operator

import torch
from torch._ops import OpOverload

from ._proto import tcc_pb2 as pb
from .dtypes import DEVICE_TO_PB, dtype_to_pb


class Unsupported(Exception):
    """A node (or value) the wire format cannot express faithfully."""


# ------------------------------------------------------------------ metas

def contiguous_strides(sizes):
    strides, acc = [], 1
    for s in reversed(sizes):
        strides.append(acc)
        acc *= max(int(s), 1)
    return tuple(reversed(strides))


def is_dense(t):
    """Non-overlapping and dense (what a fresh allocation can be)."""
    try:
        return bool(torch._prims_common.is_non_overlapping_and_dense(t))
    except Exception:
        return False


def is_concrete(t):
    """True when a (fake) tensor's sizes/strides/offset are plain ints."""
    try:
        return all(isinstance(s, int) for s in (*t.shape, *t.stride(), t.storage_offset()))
    except Exception:
        return False


def tensor_meta(dtype, sizes, strides, offset=0, device="cpu", requires_grad=False):
    d = dtype_to_pb(dtype)
    if d is None:
        raise Unsupported(f"dtype {dtype} has no tcc.v1.DType")
    dev = DEVICE_TO_PB.get(device)
    if dev is None:
        raise Unsupported(f"device {device!r}")
    return pb.TensorMeta(dtype=d, sizes=[int(s) for s in sizes], strides=[int(s) for s in strides],
                         storage_offset=int(offset), device=pb.Device(type=dev, index=0),
                         requires_grad=bool(requires_grad))


def signature_of(t):
    """The input signature of one tensor: what a compiled kernel is
    specialised for (and the key of the per-partition kernel table)."""
    return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset())


# ------------------------------------------------------------------ arguments

def _is_tensor_type(schema_arg):
    return str(schema_arg.type) == "Tensor"


def resolve_target(node):
    """(OpOverload, [(schema Argument, value)]) to send for an FX
    call_function node: its own overload, or its `.Scalar` overload when a
    Python number sits in the Tensor parameter `other`. Numbers left in
    Tensor parameters become 0-dim constants (encode_node). Raises
    Unsupported."""
    target = node.target
    if not isinstance(target, OpOverload):
        raise Unsupported(f"{target} is not an ATen overload")
    schema = target._schema
    bound = bind_arguments(schema, node.args, node.kwargs)
    scalar_in_tensor = [a.name for a, v in bound
                        if _is_tensor_type(a) and isinstance(v, (bool, int, float))]
    if scalar_in_tensor != ["other"]:
        return target, bound
    alt = getattr(target.overloadpacket, "Scalar", None)
    if alt is None:
        return target, bound
    alt_args = {a.name: a for a in alt._schema.arguments}
    if (set(alt_args) != {a.name for a in schema.arguments}
            or str(alt_args["other"].type) not in ("Scalar", "number")):  # torch 2.13 prints "number"
        return target, bound
    return alt, [(alt_args[a.name], v) for a, v in bound]


def scalar_constant_dtype(node, val_of=None):
    """The dtype a Python number in a Tensor parameter of `node` is sent as
    (a 0-dim constant): the result dtype, when that is what promotion gives
    for sure (a pointwise op whose tensor inputs and result all share one
    floating dtype). Raises Unsupported otherwise."""
    val_of = val_of or meta_val
    out = val_of(node)
    if torch.Tag.pointwise not in getattr(node.target, "tags", ()):
        raise Unsupported(f"{node.target}: a Python number in a Tensor parameter of a "
                          "non-pointwise op")
    if not isinstance(out, torch.Tensor) or not out.dtype.is_floating_point:
        raise Unsupported(f"{node.target}: a Python number in a Tensor parameter and a "
                          "non-floating result")
    for inp in node.all_input_nodes:
        v = val_of(inp)
        if not isinstance(v, torch.Tensor) or v.dtype != out.dtype:
            raise Unsupported(f"{node.target}: a Python number in a Tensor parameter "
                              "with mixed dtypes")
    return out.dtype


def bind_arguments(schema, args, kwargs):
    """[(schema Argument, value)] for the arguments the node gives (those
    left out keep their schema defaults on the daemon's side)."""
    out = []
    positional = [a for a in schema.arguments if not a.kwarg_only]
    if len(args) > len(positional):
        raise Unsupported(f"{schema.name}: {len(args)} positional arguments for "
                          f"{len(positional)} parameters")
    seen = set()
    for a, v in zip(positional, args):
        out.append((a, v))
        seen.add(a.name)
    known = {a.name: a for a in schema.arguments}
    for k, v in kwargs.items():
        if k not in known:
            raise Unsupported(f"{schema.name}: unknown argument {k!r}")
        if k in seen:
            raise Unsupported(f"{schema.name}: argument {k!r} given twice")
        out.append((known[k], v))
    order = {a.name: i for i, a in enumerate(schema.arguments)}
    out.sort(key=lambda av: order[av[0].name])
    return out


def _number_kind(v):
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int):
        return "int"
    if isinstance(v, float):
        return "float"
    return None


def meta_val(node):
    """A node's traced value (node.meta["val"])."""
    return node.meta.get("val")


def encode_argument(schema_arg, value, name_of, val_of=meta_val):
    """The pb.Argument for one bound value, or None to leave it out (the
    schema default). name_of(fx.Node) -> tensor value name; val_of(fx.Node)
    -> its (fake) value."""
    typ = str(schema_arg.type)
    if value is None:
        return pb.Argument(as_none=True)
    if isinstance(value, torch.fx.Node):
        val = val_of(value)
        if isinstance(val, torch.Tensor):
            return pb.Argument(as_tensor=pb.TensorRef(name=name_of(value)))
        raise Unsupported(f"argument {schema_arg.name!r} is a {type(val).__name__} value "
                          "computed in the graph")
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise Unsupported(f"argument {schema_arg.name!r} is symbolic")
    kind = _number_kind(value)
    if kind == "bool":
        return pb.Argument(as_bool=value)
    if kind == "int":
        if typ.startswith("float"):
            return pb.Argument(as_float=float(value))
        return pb.Argument(as_int=value)
    if kind == "float":
        return pb.Argument(as_float=value)
    if isinstance(value, torch.dtype):
        d = dtype_to_pb(value)
        if d is None:
            raise Unsupported(f"argument {schema_arg.name!r}: dtype {value}")
        return pb.Argument(as_dtype=d)
    if isinstance(value, torch.device):
        dev = DEVICE_TO_PB.get(value.type)
        if dev is None:
            raise Unsupported(f"argument {schema_arg.name!r}: device {value}")
        return pb.Argument(as_device=pb.Device(type=dev, index=value.index or 0))
    if isinstance(value, str):
        return pb.Argument(as_string=value)
    if isinstance(value, torch.layout):
        if value == torch.strided and schema_arg.has_default_value():
            return None
        raise Unsupported(f"argument {schema_arg.name!r}: layout {value}")
    if isinstance(value, torch.memory_format):
        # Every value's layout is spelled out in the graph (graph outputs
        # get the traced strides), so the format only restates it.
        if schema_arg.has_default_value():
            return None
        raise Unsupported(f"argument {schema_arg.name!r}: memory format {value}")
    if isinstance(value, (list, tuple)):
        return _encode_list(schema_arg, list(value), name_of, val_of)
    raise Unsupported(f"argument {schema_arg.name!r}: {type(value).__name__} value")


def _encode_list(schema_arg, values, name_of, val_of):
    typ = str(schema_arg.type)
    if not values:
        if typ.startswith("Tensor") or "Tensor" in typ:
            return pb.Argument(as_tensors=pb.TensorList())
        if typ.startswith("float"):
            return pb.Argument(as_floats=pb.FloatList())
        if typ.startswith("bool"):
            return pb.Argument(as_bools=pb.BoolList())
        return pb.Argument(as_ints=pb.IntList())
    optional = typ in ("Tensor?[]", "List[Optional[Tensor]]")   # None elements ride as ""
    if all(isinstance(v, torch.fx.Node) or (optional and v is None) for v in values) and any(
            isinstance(v, torch.fx.Node) for v in values):
        refs = []
        for v in values:
            if v is None:
                refs.append(pb.TensorRef(name=""))
                continue
            if not isinstance(val_of(v), torch.Tensor):
                raise Unsupported(f"argument {schema_arg.name!r}: a non-tensor in a tensor list")
            refs.append(pb.TensorRef(name=name_of(v)))
        return pb.Argument(as_tensors=pb.TensorList(values=refs))
    kinds = {_number_kind(v) for v in values}
    if None in kinds:
        bad = next(v for v in values if _number_kind(v) is None)
        raise Unsupported(f"argument {schema_arg.name!r}: list with a {type(bad).__name__}")
    if kinds == {"bool"}:
        return pb.Argument(as_bools=pb.BoolList(values=values))
    if "float" in kinds or typ.startswith("float"):
        return pb.Argument(as_floats=pb.FloatList(values=[float(v) for v in values]))
    if "bool" in kinds:
        raise Unsupported(f"argument {schema_arg.name!r}: list mixes bools and numbers")
    return pb.Argument(as_ints=pb.IntList(values=values))


def encode_node(node, name_of, output_names, val_of=meta_val, add_constant=None):
    """(pb.Node, overload) for an FX call_function node. A Python number in
    a Tensor parameter becomes a 0-dim constant: add_constant(name, tensor)
    -> value name puts it in the graph. Raises Unsupported."""
    target, bound = resolve_target(node)
    inputs = []
    for a, v in bound:
        if _is_tensor_type(a) and isinstance(v, (bool, int, float)):
            dtype = scalar_constant_dtype(node, val_of)
            t = torch.tensor(v, dtype=dtype)
            cname = f"{node.name}__{a.name}"
            if add_constant is not None:
                cname = add_constant(cname, t)
            inputs.append(pb.NamedArgument(name=a.name,
                                           arg=pb.Argument(as_tensor=pb.TensorRef(name=cname))))
            continue
        arg = encode_argument(a, v, name_of, val_of)
        if arg is not None:
            inputs.append(pb.NamedArgument(name=a.name, arg=arg))
    return pb.Node(target=str(target), inputs=inputs, outputs=output_names), target


def check_node(node):
    """Raises Unsupported unless `node` can be encoded (names don't matter).
    Returns the overload that would be sent."""
    _, target = encode_node(node, lambda n: n.name, [node.name])
    return target


def is_getitem(node):
    return node.op == "call_function" and node.target is operator.getitem


# ------------------------------------------------------------------ fake propagation

class _Recorder(torch.fx.Interpreter):
    def __init__(self, gm):
        super().__init__(gm, garbage_collect_values=False)


def _fake_input(spec, device):
    dtype, sizes, strides, offset = spec[:4]
    if any(s == 0 for s in sizes):
        span = 0
    else:
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(sizes, strides))
    base = torch.empty(offset + span, dtype=dtype, device=device)
    return base.as_strided(sizes, strides, offset)


def traced_env(gm, input_specs, constants):
    """{fx.Node: traced value} when the trace itself (node.meta["val"])
    already describes `gm` with these inputs: every placeholder's traced
    tensor has exactly the spec's (or the constant's) dtype, sizes, strides
    and offset, and every node has a concrete traced tensor (or tuple of
    them). The first compile of a partition is for the traced signature,
    so this skips running the graph on fake tensors again. None otherwise."""
    env = {}
    it = iter(input_specs)
    i = 0
    for n in gm.graph.nodes:
        if n.op == "output":
            continue
        v = meta_val(n)
        if n.op == "placeholder":
            if not isinstance(v, torch.Tensor) or not is_concrete(v):
                return None
            if i in constants:
                c = constants[i]
                want = (c.dtype, tuple(c.shape))
                got = (v.dtype, tuple(v.shape))
            else:
                dtype, sizes, strides, offset = next(it)[:4]
                want = (dtype, tuple(sizes), tuple(strides), int(offset))
                got = (v.dtype, tuple(v.shape), tuple(v.stride()), v.storage_offset())
            i += 1
            if got != want:
                return None
        elif isinstance(v, torch.Tensor):
            if not is_concrete(v):
                return None
        elif isinstance(v, (tuple, list)) and v and all(
                isinstance(t, torch.Tensor) or t is None for t in v):
            if not all(t is None or is_concrete(t) for t in v):
                return None
        else:
            return None
        env[n] = v
    return env


def propagate(gm, input_specs, constants, device="cpu"):
    """{fx.Node: fake value} for every node of `gm` when its placeholders
    hold tensors with `input_specs` (signature_of tuples) and constants
    ({placeholder index: real tensor}). Each input is faked on its traced
    value's device (a CUDA graph's own ops name theirs: a cross entropy's
    scalar_tensor(..., device=cuda:0)), else on `device`."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode()
    with mode:
        args, it = [], iter(input_specs)
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, n in enumerate(placeholders):
            if i in constants:
                args.append(mode.from_tensor(constants[i]))
            else:
                traced = meta_val(n)
                on = traced.device if isinstance(traced, torch.Tensor) else device
                args.append(_fake_input(next(it), on))
        interp = _Recorder(gm)
        interp.run(*args)
    return interp.env


# ------------------------------------------------------------------ request

def _dense_strides(sizes, strides):
    """Do strides lay sizes out without gaps or overlap (a permutation of a
    contiguous layout)? Plain ints; works for fake tensors of any mode."""
    dims = sorted((st, sz) for sz, st in zip(sizes, strides) if sz != 1)
    expect = 1
    for st, sz in dims:
        if st != expect:
            return False
        expect *= sz
    return True


def _out_strides(t, traced=None):
    """Strides a node output is declared with: its propagated value's when
    dense (else contiguous), or the traced value's (node.meta["val"]), which
    the eager rest of the program was traced against, when that one is
    dense, concrete and of the same shape and dtype (fake propagation gives
    _scaled_dot_product_flash_attention_for_cpu's output contiguous strides
    where the trace has them follow the inputs)."""
    sizes = tuple(int(s) for s in t.shape)
    if (isinstance(traced, torch.Tensor) and is_concrete(traced) and traced.dtype == t.dtype
            and tuple(traced.shape) == sizes and _dense_strides(sizes, traced.stride())):
        return tuple(int(s) for s in traced.stride())
    if is_dense(t):
        return tuple(int(s) for s in t.stride())
    return contiguous_strides(sizes)


def _constant_bytes(t):
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


# Random ops the daemon compiles with a seed tensor: a graph input appended
# after the partition's own inputs (one int64 0-dim tensor per node, drawn
# fresh per call by the caller: see fresh_seeds).
SEEDED_OPS = ("aten.native_dropout.default",)


def _add_seed(g, node, node_pb, seeds, device="cpu"):
    if node_pb.target not in SEEDED_OPS:
        return
    train = node.kwargs.get("train", node.args[2] if len(node.args) > 2 else None)
    if train is False:
        return
    name = f"{node.name}__seed"
    g.values.append(pb.TensorValue(name=name, meta=tensor_meta(torch.int64, (), (),
                                                               device=device)))
    seeds.append(name)     # graph inputs after every placeholder
    node_pb.inputs.append(pb.NamedArgument(name="seed",
                                           arg=pb.Argument(as_tensor=pb.TensorRef(name=name))))


def seed_count(graph, input_specs):
    """How many seed inputs build_graph appended to `graph`."""
    return len(graph.inputs) - len(input_specs)


def fresh_seeds(n, device="cpu"):
    """n fresh seed tensors from torch's default generator (so
    torch.manual_seed makes compiled runs reproducible), on `device`."""
    return [torch.randint(0, 1 << 62, (), dtype=torch.int64, device=device) for _ in range(n)]


def build_graph(gm, input_specs, constants=None, device="cpu"):
    """tcc.v1.Graph for partition `gm` with its non-constant placeholders
    laid out as `input_specs` ([(dtype, sizes, strides, offset)]) and
    `constants` ({placeholder index: tensor}) baked in, every value on
    `device` ("cpu" or "cuda": the target's). Returns
    (graph, output fake values, the fx node of each Graph.nodes entry).
    Raises Unsupported."""
    constants = constants or {}

    def _meta(*a):
        return tensor_meta(*a, device=device)

    env = traced_env(gm, input_specs, constants)
    if env is None:
        env = propagate(gm, input_specs, constants, device)
    g = pb.Graph()
    fx_nodes = []         # the fx node behind each g.nodes entry
    names = {}            # fx.Node -> tensor value name
    multi = {}            # fx.Node -> [output names] for multi-output nodes

    def name_of(n):
        if n not in names:
            raise Unsupported(f"value {n.name!r} is not a tensor of the partition")
        return names[n]

    def add_value(name, meta):
        g.values.append(pb.TensorValue(name=name, meta=meta))

    def add_constant(name, t):
        add_value(name, _meta(t.dtype, t.shape, contiguous_strides(t.shape)))
        g.constants.append(pb.Constant(name=name, data=_constant_bytes(t)))
        return name

    seeds = []            # seed inputs of random ops (_add_seed)
    it = iter(input_specs)
    placeholder_index = 0
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            i = placeholder_index
            placeholder_index += 1
            names[n] = n.name
            if i in constants:
                c = constants[i]
                add_value(n.name, _meta(c.dtype, c.shape, contiguous_strides(c.shape)))
                g.constants.append(pb.Constant(name=n.name, data=_constant_bytes(c)))
            else:
                dtype, sizes, strides, offset = next(it)[:4]
                add_value(n.name, _meta(dtype, sizes, strides, offset))
                g.inputs.append(n.name)
        elif n.op == "call_function" and is_getitem(n):
            src, idx = n.args
            if src not in multi:
                raise Unsupported(f"getitem of {src.name!r}, which is not a multi-output op")
            names[n] = multi[src][idx]
        elif n.op == "call_function":
            val = env[n]
            if isinstance(val, torch.Tensor):
                outs = [n.name]
                names[n] = n.name
                add_value(n.name, _meta(val.dtype, val.shape, _out_strides(val, meta_val(n))))
            elif isinstance(val, (tuple, list)):
                outs = [""] * len(val)
                for u in n.users:
                    if is_getitem(u):
                        outs[u.args[1]] = u.name
                    else:
                        raise Unsupported(f"{n.name}: a multi-output value used whole")
                traced = [meta_val(u) if is_getitem(u) else None for u in n.users]
                traced = {u.args[1]: t for u, t in zip(n.users, traced) if is_getitem(u)}
                traced = [traced.get(i) for i in range(len(val))]
                for o, v, tv in zip(outs, val, traced):
                    if o:
                        if not isinstance(v, torch.Tensor):
                            raise Unsupported(f"{n.name}: non-tensor output")
                        add_value(o, _meta(v.dtype, v.shape, _out_strides(v, tv)))
                multi[n] = outs
            else:
                raise Unsupported(f"{n.name} produces a {type(val).__name__}")
            node_pb, _ = encode_node(n, name_of, outs, env.get, add_constant)
            _add_seed(g, n, node_pb, seeds, device)
            g.nodes.append(node_pb)
            fx_nodes.append(n)
        elif n.op == "output":
            outs = n.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else [outs]
            for o in outs:
                if not isinstance(o, torch.fx.Node):
                    raise Unsupported("a partition output that is not a tensor node")
                g.outputs.append(name_of(o))
            out_vals = [env[o] for o in outs]
        else:
            raise Unsupported(f"{n.op} node {n.name!r}")
    g.inputs.extend(seeds)
    return g, out_vals, fx_nodes
