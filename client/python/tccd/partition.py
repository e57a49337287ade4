"""What the daemon compiles, node by node, and maximal partitions of it.

1. The op table: `Compiler.Ops` tells which ATen overloads (and tensor
   dtypes) the daemon compiles for a device; the answer is cached per
   address. A daemon without that RPC answers UNIMPLEMENTED; then each
   candidate op is verified by a *trial compile*: a one-node graph (for
   pointwise ops with all sizes 1) is compiled and the op counts as
   supported when that succeeds (UNIMPLEMENTED or INVALID_ARGUMENT: not
   supported; any other failure is raised). Trial verdicts are cached per address too,
   and repeat as cache hits on the daemon, so they cost one small compile
   per op the first time a daemon sees it.
2. Verdicts: a node is compiled only when it is an ATen overload that
   neither mutates nor aliases its way out (see 4), every tensor it reads
   or makes is a CPU tensor of a supported dtype, every argument has a
   faithful wire encoding (graph.check_node) and the table has its target.
   Everything else runs eagerly; the reason is kept for the log.
3. Partitions: torch.fx's CapabilityBasedPartitioner makes maximal
   acyclic groups of supported nodes (single nodes included); each becomes
   a submodule `tccd_<i>` of the graph (fuse_by_partitions).
4. Views: an op that returns an alias of its input (schema `Tensor(a)`,
   or kind "view" in the table) may live inside a partition. When its
   result leaves the partition it must stay a view, not a copy: a plain
   metadata view (view_source) is handed back by the partition's wrapper
   as an alias of the kernel's buffer or of the input it views
   (OutputAssembly); any other (a view with a computed argument, a dtype
   view, a multi-output split still used whole) is marked eager and the
   partitions are proposed again until none escapes. Splits whose pieces
   are taken one by one become slices first (splits_to_slices).
"""
import concurrent.futures
import logging
import operator
import re
import threading

import torch
from torch._ops import OpOverload
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions

from . import graph as G
from ._proto import tcc_pb2 as pb
from .dtypes import PB_TO_TORCH, dtype_to_pb
from .errors import TccdCompileError, TccdUnsupported

log = logging.getLogger("tccd")

PREFIX = "tccd_"


class OpTable:
    """The daemon's answer to Compiler.Ops (source "rpc"), or an empty
    table whose ops are verified by trial compiles (source "probe")."""

    def __init__(self, source, ops=None, dtypes=None, compiler=""):
        self.source = source
        self.ops = dict(ops or {})          # target -> kind
        self.dtypes = set(dtypes or ())     # torch dtypes (rpc only)
        self.compiler = compiler

    @classmethod
    def from_response(cls, resp):
        dtypes = {PB_TO_TORCH[d] for d in resp.dtypes if d in PB_TO_TORCH}
        return cls("rpc", {o.target: o.kind for o in resp.ops}, dtypes, resp.compiler)


_tables = {}
_tables_lock = threading.Lock()


def op_table(client, cfg, device=pb.CPU):
    """The (cached) OpTable of the daemon at client.addr."""
    key = (client.addr, device, cfg.ops)
    with _tables_lock:
        t = _tables.get(key)
    if t is not None:
        return t
    if cfg.ops == "probe":
        t = OpTable("probe")
    else:
        try:
            t = OpTable.from_response(client.ops(device))
        except TccdUnsupported:
            if cfg.ops == "rpc":
                raise
            log.info("tccd at %s has no Compiler.Ops; verifying ops by trial compiles",
                     client.addr)
            t = OpTable("probe")
    with _tables_lock:
        return _tables.setdefault(key, t)


def forget_op_tables():
    """Drops every cached op table, trial verdict and learned rejection
    (tests, daemon upgrades)."""
    with _tables_lock:
        _tables.clear()
        _probes.clear()
        _rejected.clear()


# ------------------------------------------------------------------ learned rejections

_rejected = {}   # (addr, probe key) -> reason
_NODE_RE = re.compile(r"^node (\d+) \(([^)]*)\)")                   # INVALID_ARGUMENT
_UNSUPPORTED_RE = re.compile(r"unsupported op '([^']*)' \(node (\d+)\)")  # UNIMPLEMENTED


def learn_rejection(addr, message, fx_nodes):
    """A partition compile was refused with a message naming a node
    ("node 7 (aten.sum.dim_IntList): ..."): remember that node's form so the
    next partitioning leaves it out. Returns True when the node's form is
    now known to be refused (the partitioning made before this round could
    not know it)."""
    m = _NODE_RE.match(message or "")
    if m:
        i, target_name = int(m.group(1)), m.group(2)
    else:
        m = _UNSUPPORTED_RE.search(message or "")
        if not m:
            return False
        i, target_name = int(m.group(2)), m.group(1)
    if not 0 <= i < len(fx_nodes):
        return False
    n = fx_nodes[i]
    if not isinstance(n.target, OpOverload) or str(n.target) != target_name:
        # the daemon names the overload it was sent (maybe the .Scalar one)
        try:
            target = G.resolve_target(n)[0]
        except G.Unsupported:
            return False
        if str(target) != target_name:
            return False
    key = (addr, _rejection_key(n))
    with _tables_lock:
        _rejected.setdefault(key, f"refused by the daemon: {message}")
    return True


def rejected(addr, node, overload):
    """The reason a node of this form was refused before, or None."""
    with _tables_lock:
        return _rejected.get((addr, _rejection_key(node)))


def _rejection_key(node):
    """A refused node's form down to its sizes and argument values: the
    daemon may refuse a node for its sizes alone (an embedding backward
    over a 30000-row vocabulary), which says nothing of the same op over
    64 rows."""
    sizes = tuple(str(tuple(G.meta_val(i).shape)) for i in node.all_input_nodes)
    values = tuple(repr(a) for a in list(node.args) + list(node.kwargs.values())
                   if not isinstance(a, (torch.fx.Node, list, tuple)))
    return _probe_key(node, node.target) + sizes + values


# ------------------------------------------------------------------ trial compiles

_probes = {}   # (addr, target, options, probe key) -> (bool, reason)


def _probe_key(node, overload):
    parts = [str(overload)]
    for inp in node.all_input_nodes:
        v = G.meta_val(inp)
        parts.append((v.dtype, v.dim()))
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, (list, tuple)):
            parts.append(f"{type(a).__name__}[{len(a)}]")
        elif not isinstance(a, torch.fx.Node):
            parts.append(type(a).__name__)
    return tuple(map(str, parts))


def _probe_graph(node):
    """A GraphModule holding only `node` (its tensor inputs as placeholders)
    and the input specs to compile it with."""
    g = torch.fx.Graph()
    env = {}
    specs = []
    pointwise = torch.Tag.pointwise in getattr(node.target, "tags", ())
    for inp in node.all_input_nodes:
        v = G.meta_val(inp)
        p = g.placeholder(inp.name)
        p.meta["val"] = v
        env[inp] = p
        sizes = (1,) * v.dim() if pointwise else tuple(int(s) for s in v.shape)
        specs.append((v.dtype, sizes, G.contiguous_strides(sizes), 0))
    new = g.node_copy(node, lambda n: env[n])
    val = G.meta_val(node)
    if isinstance(val, (tuple, list)):
        g.output(tuple(g.call_function(operator.getitem, (new, i)) for i in range(len(val))))
    else:
        g.output((new,))
    return torch.fx.GraphModule(torch.nn.Module(), g), specs


def _probe(client, request_base, node, overload):
    """Trial-compiles one node; returns (ok, reason)."""
    try:
        gm, specs = _probe_graph(node)
        device = "cuda" if request_base.target.device == pb.CUDA else "cpu"
        graph = G.build_graph(gm, specs, device=device)[0]
    except (G.Unsupported, RuntimeError, TypeError, ValueError) as e:
        return False, f"cannot build a trial graph: {e}"
    req = pb.CompileRequest()
    req.CopyFrom(request_base)
    req.graph.CopyFrom(graph)
    req.client += f" trial {overload}"
    try:
        client.compile(req)
        return True, ""
    except TccdUnsupported as e:
        return False, f"trial compile: {e.status}: {e.message}"
    except TccdCompileError as e:
        # The daemon rejects the node (an argument or dtype it does not
        # take): unsupported. Anything else (the compiler failing,
        # RESOURCE_EXHAUSTED, ...) is an error for the caller.
        if e.status == "INVALID_ARGUMENT":
            return False, f"trial compile: {e.status}: {e.message}"
        raise


# ------------------------------------------------------------------ verdicts

def _tensors(val):
    if isinstance(val, torch.Tensor):
        return [val]
    if isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return list(val)
    # multi-output ops whose output_mask leaves some results undefined
    # (convolution_backward without a bias): the daemon discards those
    if (isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
            and all(v is None or isinstance(v, torch.Tensor) for v in val)):
        return [v for v in val if v is not None]
    return None


def returns_alias(overload, table):
    if table.ops.get(str(overload)) == "view":
        return True
    return any(r.alias_info is not None for r in overload._schema.returns)


def static_verdict(node, table, device="cpu"):
    """(overload or None, reason): whether `node` may be sent at all (its
    tensors all on `device`, the graph's)."""
    target = node.target
    if not isinstance(target, OpOverload):
        return None, "not an ATen overload"
    if target._schema.is_mutable and not writes_in_place(node):
        return None, "mutates an input"
    outs = _tensors(G.meta_val(node))
    if outs is None:
        return None, "does not produce tensors"
    ins = []
    for inp in node.all_input_nodes:
        v = G.meta_val(inp)
        if not isinstance(v, torch.Tensor):
            return None, f"reads a {type(v).__name__} computed in the graph"
        ins.append(v)
    for t in ins + outs:
        if t.device.type != device:
            return None, f"a {t.device.type} tensor in a {device} graph"
        if dtype_to_pb(t.dtype) is None:
            return None, f"dtype {t.dtype}"
        if table.source == "rpc" and t.dtype not in table.dtypes:
            return None, f"dtype {t.dtype} not compiled by tccd"
    try:
        overload = G.check_node(node)
    except G.Unsupported as e:
        return None, str(e)
    if table.source == "rpc" and str(overload) not in table.ops:
        return None, "not compiled by tccd"
    why = _storage_view_refusal(node, str(overload))
    if why:
        return None, why
    return overload, ""


def _row_major_storage(t):
    """True when fake tensor t's storage holds exactly its elements,
    row-major from the start (a fresh contiguous tensor)."""
    return (t.is_contiguous() and t.storage_offset() == 0
            and t.untyped_storage().nbytes() == t.numel() * t.element_size())


def _storage_view_refusal(node, name):
    """Why the daemon's reading of an op that addresses storage would differ
    from eager's here ("" when it would not). tccd reads as_strided over a
    value computed in the kernel as a view of the value's row-major
    flattening, and as_strided_scatter's self row-major (eager scatters
    into a clone of self: row-major when self is contiguous); the strides
    of intermediate values are not part of a kernel's key, so the layouts
    eager gives them are checked here, where they are known."""
    if name == "aten.as_strided.default":
        src = node.args[0]
        if src.op != "placeholder" and not _row_major_storage(G.meta_val(src)):
            return "as_strided of a value that is not its storage, row-major"
    elif name == "aten.as_strided_scatter.default":
        if not G.meta_val(node.args[0]).is_contiguous():
            return "as_strided_scatter into a non-contiguous tensor"
    return ""


def verdicts(gm, table, client=None, request_base=None, device="cpu"):
    """({node: (ok, reason)} for every call_function node of gm, number of
    trial compiles made)."""
    out = {}
    trials = 0
    pending = {}   # probe key -> [(node, overload)]
    for n in gm.graph.nodes:
        if n.op != "call_function" or G.is_getitem(n):
            continue
        overload, reason = static_verdict(n, table, device)
        if overload is not None and client is not None:
            why = rejected(client.addr, n, overload)
            if why is not None:
                overload, reason = None, why
        if overload is None:
            out[n] = (False, reason)
        elif table.source == "rpc":
            out[n] = (True, "")
        else:
            pending.setdefault(_probe_key(n, overload), []).append((n, overload))
    if pending:
        addr = client.addr
        opt = request_base.SerializeToString()
        todo = {}
        for key, nodes in pending.items():
            pk = (addr, opt, key)
            with _tables_lock:
                hit = _probes.get(pk)
            if hit is None:
                todo[key] = nodes[0]
        trials = len(todo)
        if todo:
            with concurrent.futures.ThreadPoolExecutor(max_workers=min(8, len(todo))) as ex:
                futs = {key: ex.submit(_probe, client, request_base, n, ov)
                        for key, (n, ov) in todo.items()}
                for key, f in futs.items():
                    res = f.result()
                    with _tables_lock:
                        _probes[(addr, opt, key)] = res
                    if not res[0]:
                        log.debug("tccd: %s falls back: %s", todo[key][1], res[1])
        for key, nodes in pending.items():
            with _tables_lock:
                ok, reason = _probes[(addr, opt, key)]
            for n, _ in nodes:
                out[n] = (ok, reason or "")
    for n in gm.graph.nodes:
        if G.is_getitem(n):
            src = n.args[0]
            out[n] = out.get(src, (False, "getitem of an eager value"))
    return out, trials


# ------------------------------------------------------------------ partitions

class _Support(OperatorSupportBase):
    def __init__(self, ok):
        self.ok = ok

    def is_node_supported(self, submodules, node):
        return self.ok.get(node, False)


def _one_partition(gm, ok):
    """The supported call_function nodes as one partition, in graph order,
    when no unsupported node lies between two supported ones (none has
    both a supported node upstream and one downstream): then no merge can
    make a cycle, and CapabilityBasedPartitioner (horizontal fusion on)
    would merge them all into exactly this -- only slower, its cycle
    checks being quadratic (3.3 s of a BERT-base training step's first
    call under cProfile). None when it does not apply, or when the graph
    has no supported node."""
    nodes = list(gm.graph.nodes)
    supported = [n for n in nodes if n.op == "call_function" and ok.get(n, False)]
    if not supported:
        return None
    up = {}                              # n -> a supported node is upstream of n (or n itself)
    for n in nodes:
        up[n] = ok.get(n, False) or any(up[a] for a in n.all_input_nodes)
    down = {}                            # n -> a supported node is downstream of n (or n itself)
    for n in reversed(nodes):
        down[n] = ok.get(n, False) or any(down[u] for u in n.users)
    for n in nodes:
        if not ok.get(n, False) and any(up[a] for a in n.all_input_nodes) \
                and any(down[u] for u in n.users):
            return None
    return [supported]


def propose(gm, verdict, table):
    """Partitions (lists of nodes) of supported nodes; updates `verdict`
    for views that would escape their partition."""
    while True:
        ok = {n: v[0] for n, v in verdict.items()}
        parts = _one_partition(gm, ok)
        if parts is None:
            parts = [list(p.nodes) for p in CapabilityBasedPartitioner(
                gm, _Support(ok), allows_single_node_partition=True).propose_partitions()]
        escaping = []
        for p in parts:
            members = set(p)
            for n in members:
                if G.is_getitem(n) or not isinstance(n.target, OpOverload):
                    continue
                if (returns_alias(n.target, table) and view_source(n) is None
                        and any(u not in members for u in n.users)):
                    escaping.append(n)
        if not escaping:
            return parts
        for n in escaping:
            verdict[n] = (False, "a view whose result leaves the compiled partition")


def fuse(gm, parts):
    """Replaces each partition by a call_module `tccd_<i>` (returns a tuple
    always); returns [(name, submodule)]."""
    if not parts:
        return []
    fuse_by_partitions(gm, [dict.fromkeys(p) for p in parts], prefix=PREFIX,
                       always_return_tuple=True)
    return [(n.target, getattr(gm, n.target)) for n in gm.graph.nodes
            if n.op == "call_module" and n.target.startswith(PREFIX)]


def write_in_place(gm, mutations):
    """Makes an inference graph write its new cache rows into the cache.

    A KV cache updated with index_copy_ (transformers' StaticCache)
    reaches an AOTAutograd graph functionalized: index_put(cache, idx,
    rows) makes a whole new cache, the attention reads that, and
    AOTAutograd's epilogue copies it back into the input -- two copies of
    the whole cache a step, where eager writes the new rows. For each
    mutated input (`mutations`: (graph output, placeholder index) pairs,
    the output being the input's new value, data mutated only) whose one
    use is such an index_put (accumulate off) returned as its new value,
    the index_put becomes index_put_ on the input itself: every reader of
    the new value reads the index_put_'s result, the input written in
    place, and the graph returns the input as its new value, so that the
    epilogue's copy_ of the input onto itself is a no-op (copy_ of the
    same data). A daemon that compiles aten.index_put_ (into a graph
    input read by nothing else: compiler/verify.c) writes the rows inside
    the partition that reads them, ordered by that result; elsewhere the
    write runs eagerly between partitions, where it is ordered after the
    rows it writes and before every read of the cache. Returns how many
    it rewrote."""
    outs = list(gm.graph.output_node().args[0])
    phs = [n for n in gm.graph.nodes if n.op == "placeholder"]
    done = 0
    for k, i in mutations:
        if k >= len(outs) or i >= len(phs):
            continue
        u, ph = outs[k], phs[i]
        if not (isinstance(u, torch.fx.Node) and u.op == "call_function"
                and u.target is torch.ops.aten.index_put.default):
            continue
        acc = u.args[3] if len(u.args) > 3 else u.kwargs.get("accumulate", False)
        if acc or u.args[0] is not ph or len(ph.users) != 1 or ph in _flat_nodes((u.args[1:], u.kwargs)):
            continue
        new, old = G.meta_val(u), G.meta_val(ph)
        if not (isinstance(new, torch.Tensor) and isinstance(old, torch.Tensor)):
            continue
        layouts = (tuple(new.shape), new.stride(), tuple(old.shape), old.stride())
        if not all(type(x) is int for t in layouts for x in t) or (   # no symbolic sizes
                layouts[:2] != layouts[2:] or new.dtype != old.dtype):
            continue
        with gm.graph.inserting_after(u):
            w = gm.graph.call_function(torch.ops.aten.index_put_.default, u.args, u.kwargs)
        w.meta = dict(u.meta)
        u.replace_all_uses_with(w)
        gm.graph.erase_node(u)
        outs[k] = ph
        done += 1
    if done:
        out = gm.graph.output_node()
        out.args = (type(out.args[0])(outs),) + tuple(out.args[1:])
        gm.graph.lint()
        gm.recompile()
    return done


def _flat_nodes(tree):
    out = []
    torch.fx.node.map_arg(tree, lambda n: out.append(n) or n)
    return out


def writes_in_place(node):
    """Is `node` one of write_in_place's index_put_ (eager, not an op
    that falls back: it stands for the epilogue's copy_)?"""
    return (node.op == "call_function" and node.target is torch.ops.aten.index_put_.default
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder")


def count_ops(gm):
    """Call_function nodes (getitem and in-place writes excluded): the
    graph's ops."""
    return sum(1 for n in gm.graph.nodes if n.op == "call_function" and not G.is_getitem(n)
               and not writes_in_place(n))


def count_writes_in_place(gm):
    return sum(1 for n in gm.graph.nodes if writes_in_place(n))


def op_names(gm):
    """{target name: count} of gm's ops."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "call_function" and not G.is_getitem(n) and not writes_in_place(n):
            k = str(n.target) if isinstance(n.target, OpOverload) else getattr(
                n.target, "__name__", str(n.target))
            out[k] = out.get(k, 0) + 1
    return out


# ------------------------------------------------------------------ splits

_SPLITS = ("aten.split_with_sizes.default", "aten.split.Tensor", "aten.unbind.int")


def splits_to_slices(gm):
    """Rewrites split_with_sizes / split / unbind, whose pieces are taken
    with getitem, into one slice (select for unbind) per piece used: the
    same views, as single-output ops the daemon compiles and the wrapper
    can hand back as aliases. Leaves a split alone when its sizes are not
    plain ints or its result is used whole. Returns the number rewritten."""
    aten = torch.ops.aten
    done = 0
    for n in list(gm.graph.nodes):
        if n.op != "call_function" or str(n.target) not in _SPLITS:
            continue
        if not n.users or not all(G.is_getitem(u) for u in n.users):
            continue
        src = n.args[0]
        sv = G.meta_val(src)
        if not isinstance(src, torch.fx.Node) or not isinstance(sv, torch.Tensor):
            continue
        rest = list(n.args[1:])
        kw = dict(n.kwargs)
        unbind = str(n.target) == "aten.unbind.int"
        dim = kw.pop("dim", rest[1] if len(rest) > 1 else 0) if not unbind else \
            kw.pop("dim", rest[0] if rest else 0)
        if kw or not isinstance(dim, int) or not G.is_concrete(sv):
            continue
        dim = dim % sv.dim() if sv.dim() else 0
        length = int(sv.shape[dim])
        if unbind:
            bounds = [(i, None) for i in range(length)]
        else:
            arg = rest[0]
            if isinstance(arg, int):                       # split.Tensor: piece size
                if arg <= 0:
                    continue
                sizes = [min(arg, length - s) for s in range(0, length, arg)] or [0]
            elif isinstance(arg, (list, tuple)) and all(isinstance(s, int) for s in arg):
                sizes = list(arg)
            else:
                continue
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            bounds = [(s, s + z) for s, z in zip(starts, sizes)]
        for u in list(n.users):
            i = u.args[1]
            with gm.graph.inserting_before(u):
                if unbind:
                    piece = gm.graph.call_function(aten.select.int, (src, dim, bounds[i][0]))
                else:
                    piece = gm.graph.call_function(aten.slice.Tensor,
                                                   (src, dim, bounds[i][0], bounds[i][1]))
            piece.meta = dict(u.meta)
            u.replace_all_uses_with(piece)
            gm.graph.erase_node(u)
        gm.graph.erase_node(n)
        done += 1
    if done:
        gm.graph.lint()
        gm.recompile()
    return done


# ------------------------------------------------------------------ alias outputs

def view_source(node):
    """The node whose tensor `node` is a view of, when `node` is a pure
    metadata view the partition wrapper can re-make over a real buffer: an
    ATen overload returning one alias of its first argument, reading no
    other graph value and keeping the dtype. None otherwise."""
    if node.op != "call_function" or not isinstance(node.target, OpOverload):
        return None
    rets = node.target._schema.returns
    if (len(rets) != 1 or rets[0].alias_info is None or rets[0].alias_info.is_write
            or str(rets[0].type) != "Tensor"):
        return None
    if not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    src = node.args[0]
    flat = list(node.args[1:]) + list(node.kwargs.values())
    while flat:
        a = flat.pop()
        if isinstance(a, (list, tuple)):
            flat.extend(a)
        elif isinstance(a, (torch.fx.Node, torch.SymInt, torch.SymFloat, torch.SymBool)):
            return None
    v, sv = G.meta_val(node), G.meta_val(src)
    if not isinstance(v, torch.Tensor) or not isinstance(sv, torch.Tensor) or v.dtype != sv.dtype:
        return None
    return src


# A view with known-good sizes/strides/offset, without as_strided's checks
# (Inductor's reinterpret_tensor: half the cost, 2 us instead of 4 per
# view; a BERT training step makes ~100). Used once as_strided has
# accepted the same layouts over buffers of the same signature.
# Its offset is relative to the base's own storage offset.
_reinterpret = getattr(getattr(torch._C, "_dynamo", None) and torch._C._dynamo.guards,
                       "_reinterpret_tensor", None)
if _reinterpret is None:
    def _reinterpret(base, sizes, strides, offset_increment):
        return base.as_strided(sizes, strides, base.storage_offset() + offset_increment)


def _layouts_of(tensors):
    """(sizes, strides, storage offset) of each tensor (None stays None)."""
    return [None if t is None else (tuple(t.shape), tuple(t.stride()), t.storage_offset())
            for t in tensors]


class OutputAssembly:
    """How a partition's outputs are made. Most are kernel outputs; an
    output that is a view (a chain of view_source steps) of a kernel output
    or of a partition input is handed back as an alias of that buffer, as
    eager would: its sizes, strides and offset come from replaying the
    chain on a meta tensor laid out like the real buffer (once per input
    signature), then one view per run: as_strided the first time (it
    checks the view fits), Inductor's reinterpret_tensor after that. A
    saved recipe (recipe.py) keeps the layouts with those of the buffers they
    were replayed on: a process running from it makes the same views over
    buffers laid out the same way with reinterpret_tensor from the first
    call (a BERT forward's first call made ~170 dispatched view ops, each
    through AOTAutograd's first-call checking mode). The kernel computes
    only `kernel_gm`: the partition with those outputs replaced by their
    roots and the views nothing else reads removed.

    steps[i] for output i: ("kernel", j), or ("view", source, chain) with
    source ("kernel", j) or ("input", placeholder index) and chain the view
    calls from the root outwards, each (op, args after the first, kwargs):
    plain values, no fx nodes, so a recipe pickles without its graph."""

    def __init__(self, sub_gm):
        graph = sub_gm.graph
        outs = list(graph.output_node().args[0])
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        kernel_outs = []

        def kernel_index(n):
            if n not in kernel_outs:
                kernel_outs.append(n)
            return kernel_outs.index(n)

        self.steps = []
        for o in outs:
            chain, root = [], o
            while view_source(root) is not None:
                chain.append(root)
                root = view_source(root)
            calls = [(n.target, tuple(n.args[1:]), dict(n.kwargs)) for n in reversed(chain)]
            if not chain:
                self.steps.append(("kernel", kernel_index(o)))
            elif root.op == "placeholder":
                self.steps.append(("view", ("input", placeholders.index(root)), calls))
            else:
                self.steps.append(("view", ("kernel", kernel_index(root)), calls))
        self.trivial = kernel_outs == outs
        self.n_views = sum(1 for s in self.steps if s[0] == "view")
        if self.trivial:
            self.kernel_gm = sub_gm
        elif not kernel_outs:
            self.kernel_gm = None            # nothing to compute: views of inputs only
        else:
            g = torch.fx.Graph()
            env = {}
            g.graph_copy(graph, env)
            g.output(tuple(env[n] for n in kernel_outs))
            g.eliminate_dead_code()
            self.kernel_gm = torch.fx.GraphModule(sub_gm, g)
        self._layouts = {}                   # signature key -> [(sizes, strides, offset)]
        self._bases = {}                     # signature key -> the bases' layouts replayed on
        self._saved = {}                     # signature key -> (bases' layouts, layouts) (recipe)

    def __getstate__(self):
        """Pickled (in a saved recipe, recipe.py): the steps, ops by name
        (OpOverloads do not pickle), and the layouts replayed so far with
        the layouts of the buffers they were replayed on; the kernel graph
        stays with the process that partitioned."""
        steps = [s if s[0] == "kernel" else
                 (s[0], s[1], [(str(op), args, kwargs) for op, args, kwargs in s[2]])
                 for s in self.steps]
        saved = dict(self._saved)
        saved.update((k, (self._bases[k], v)) for k, v in self._layouts.items()
                     if k in self._bases)
        return dict(steps=steps, trivial=self.trivial, n_views=self.n_views, saved=saved)

    def __setstate__(self, state):
        def op_named(name):          # "aten.view.default" -> the OpOverload
            ns, packet, overload = name.split(".")
            return getattr(getattr(getattr(torch.ops, ns), packet), overload)

        steps = [s if s[0] == "kernel" else
                 (s[0], s[1], [(op_named(op), args, kwargs) for op, args, kwargs in s[2]])
                 for s in state["steps"]]
        saved = state.pop("saved", {})
        self.__dict__.update(state, steps=steps, kernel_gm=None, _layouts={}, _bases={},
                             _saved=saved)

    @staticmethod
    def _replay(chain, base):
        """The view `chain` applied to a meta tensor laid out like `base`:
        (sizes, strides, storage offset). Raises RuntimeError when the
        chain cannot view this layout."""
        span = 1 + sum((s - 1) * abs(st) for s, st in zip(base.shape, base.stride()))
        if any(s == 0 for s in base.shape):
            span = 0
        meta = torch.empty(base.storage_offset() + span, dtype=base.dtype,
                           device="meta").as_strided(base.shape, base.stride(),
                                                     base.storage_offset())
        v = meta
        for op, args, kwargs in chain:
            v = op(v, *args, **kwargs)
        return tuple(v.shape), tuple(v.stride()), v.storage_offset()

    def assemble(self, key, inputs, kernel_outs):
        """The partition's outputs from the kernel's and the (full,
        constants included) inputs. Raises RuntimeError when a view cannot
        be made over these buffers (the caller runs eagerly)."""
        if self.trivial:
            return kernel_outs
        layouts = self._layouts.get(key)
        bases = [inputs[s[1][1]] if s[0] == "view" and s[1][0] == "input"
                 else kernel_outs[s[1][1]] if s[0] == "view" else None for s in self.steps]
        out = []
        if layouts is None:
            seen = _layouts_of(bases)
            saved = self._saved.get(key)
            if saved is not None and saved[0] == seen:
                # a saved recipe replayed these views on buffers laid out
                # exactly so: the same layouts, no replay
                layouts = self._layouts[key] = saved[1]
            else:
                # as_strided checks that each view fits its buffer (a
                # RuntimeError sends the signature to eager)
                layouts = [self._replay(s[2], b) if s[0] == "view" else None
                           for s, b in zip(self.steps, bases)]
                for s, b, lay in zip(self.steps, bases, layouts):
                    out.append(kernel_outs[s[1]] if s[0] == "kernel" else b.as_strided(*lay))
                self._layouts[key] = layouts
                self._bases[key] = seen
                return out
        for s, b, lay in zip(self.steps, bases, layouts):
            if s[0] == "kernel":
                out.append(kernel_outs[s[1]])
            else:   # the same layouts over buffers of the same signature
                out.append(_reinterpret(b, lay[0], lay[1], lay[2] - b.storage_offset()))
        return out
