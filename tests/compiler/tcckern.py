"""Compile ATen FX graphs with libtcccompiler (no daemon) and run them.

Shared by tests/compiler/test_*.py and scripts/bench-kernels:

    k = compile_fx(gm, inputs)        # build-dir tcc-compile-file
    outs = k(*inputs)                 # ctypes call of tcc_entry
    k.kernels, k.kinds, k.compile_ms

The graph goes through the client's own converter (tccd.graph.build_graph),
so the metas are exactly what the PyTorch client sends.
"""
import ctypes
import json
import operator
import os
import subprocess
import tempfile

import torch

from tccd import graph as tg
from tccd._proto import tcc_pb2 as pb

ROOT = os.environ.get("TCC_SOURCE_DIR") or os.path.abspath(os.path.join(os.path.dirname(__file__), "../.."))
BUILD = os.environ.get("TCC_BUILD_DIR") or os.path.join(ROOT, "build")
TOOL = os.path.join(BUILD, "tests", "compiler", "tcc-compile-file")
_TMP = tempfile.mkdtemp(prefix="tcckern-")

PB_TO_TORCH = {
    pb.FLOAT32: torch.float32, pb.FLOAT64: torch.float64, pb.FLOAT16: torch.float16,
    pb.BFLOAT16: torch.bfloat16, pb.INT8: torch.int8, pb.INT16: torch.int16,
    pb.INT32: torch.int32, pb.INT64: torch.int64, pb.UINT8: torch.uint8, pb.BOOL: torch.bool,
}


class CompileError(Exception):
    def __init__(self, code, message):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


class Kernel:
    def __init__(self, so, info, out_metas, isa):
        self.lib = ctypes.CDLL(so)
        self.fn = self.lib.tcc_entry
        self.fn.restype = ctypes.c_int
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.kernels = info["kernels"]
        self.kinds = info["kinds"]
        self.compile_ms = info["compile_ms"]
        self.bodies_reused = info.get("bodies_reused", 0)   # from $TCC_OBJECT_DIR's object cache
        self.workspace = info["workspace"]
        self.groups = info.get("groups", [])
        self.identity = info.get("identity", "")   # "... onednn/2.6 ..." on the oneDNN road
        self.out_metas = out_metas
        self.ws = torch.empty(max(self.workspace, 1) + 64, dtype=torch.uint8)
        self.source = None

    def alloc_workspace(self):
        return torch.empty(max(self.workspace, 1) + 64, dtype=torch.uint8)

    def alloc_outputs(self):
        return [torch.empty_strided(tuple(m.sizes), tuple(m.strides), dtype=PB_TO_TORCH[m.dtype])
                for m in self.out_metas]

    def __call__(self, *inputs, outs=None, ws=None):
        """Runs tcc_entry (ctypes lets go of the GIL: threads may call at
        once, each with its own outs and workspace `ws`)."""
        outs = outs if outs is not None else self.alloc_outputs()
        ins = (ctypes.c_void_p * max(len(inputs), 1))(*[t.untyped_storage().data_ptr() for t in inputs])
        os_ = (ctypes.c_void_p * max(len(outs), 1))(*[o.data_ptr() for o in outs])
        base = (self.ws if ws is None else ws).data_ptr()
        ws = base + (-base) % 64
        rc = self.fn(ins, os_, ctypes.c_void_p(ws))
        if rc != 0:
            raise RuntimeError(f"kernel returned {rc} (index out of range or integer division by zero)")
        return outs


def kernel_text(src, comment_re):
    """Kernel kN's C text in a generated source: from its comment (matching
    comment_re, e.g. r"k\\d+: extern gemm") to the next kernel's, and the
    shared body it runs (compiler/cpu/emit.c), wherever an earlier kernel
    printed it."""
    import re
    m = re.search(r"/\* " + comment_re + r".*?(?=\n/\* k\d+: |\n/\* the kernels|\n__attribute__\(\(visibility)",
                  src, re.S)
    if not m:
        raise AssertionError(f"no kernel /* {comment_re} in the source")
    runs = re.search(r"runs (tcc_b\w+) \*/", m.group(0))
    body_re = r"(?:static|TCC_BODY) int " + (runs.group(1) if runs else "") + r"\(void \*const \*P\) \{.*?\n}\n"
    if not runs or re.search(body_re, m.group(0), re.S):
        return m.group(0)
    body = re.search(body_re, src, re.S)
    return m.group(0) + "\n" + body.group(0)


def request_for(gm, inputs, isa="x86-64-v3", constants=None):
    specs = [tg.signature_of(t) for t in inputs]
    g = tg.build_graph(gm, specs, constants or {})[0]   # (graph, outputs, ...)
    req = pb.CompileRequest(graph=g, target=pb.Target(device=pb.CPU, cpu_isa=isa),
                            options=pb.Options(mode=pb.DEFAULT))
    return req


def compile_request(req, env=None, keep_source=False):
    fd, path = tempfile.mkstemp(suffix=".pb", dir=_TMP)
    with os.fdopen(fd, "wb") as f:
        f.write(req.SerializeToString())
    so = path[:-3] + ".so"
    cmd = [TOOL, path, so] + ([path[:-3] + ".c"] if keep_source else [])
    r = subprocess.run(cmd, capture_output=True, text=True, env=env)
    info = json.loads(r.stdout.strip().splitlines()[-1]) if r.stdout.strip() else {}
    if r.returncode != 0 or "error" in info:
        raise CompileError(info.get("error"), info.get("message", r.stderr))
    metas = {v.name: v.meta for v in req.graph.values}
    k = Kernel(so, info, [metas[o] for o in req.graph.outputs], req.target.cpu_isa)
    if keep_source:
        with open(path[:-3] + ".c") as f:
            k.source = f.read()
    return k


def compile_fx(gm, inputs, isa="x86-64-v3", env=None, keep_source=False):
    return compile_request(request_for(gm, inputs, isa), env=env, keep_source=keep_source)


def op_graph(op, args, kwargs=None, nout=None, take=None):
    """An FX graph calling `op` once. Tensors in args (or in lists in
    args) become placeholders, in order; returns (gm, tensor inputs)."""
    kwargs = kwargs or {}
    g = torch.fx.Graph()
    inputs = []

    def sub(a):
        if isinstance(a, torch.Tensor):
            inputs.append(a)
            return g.placeholder(f"x{len(inputs) - 1}")
        if isinstance(a, (list, tuple)) and any(isinstance(x, torch.Tensor) for x in a):
            return type(a)(sub(x) for x in a)
        return a

    fargs = tuple(sub(a) for a in args)
    fkw = {k: sub(v) for k, v in kwargs.items()}
    node = g.call_function(op, fargs, fkw)
    if nout:
        idx = take if take is not None else range(nout)
        g.output(tuple(g.call_function(operator.getitem, (node, i)) for i in idx))
    else:
        g.output(node)
    return torch.fx.GraphModule(torch.nn.Module(), g), inputs


def aten_graph(fn, inputs, decompose=True):
    """fn traced to an ATen graph (core ATen decompositions when decompose)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch._decomp import core_aten_decompositions
    if not decompose:
        return make_fx(fn)(*inputs)
    from torch.func import functionalize   # core ATen has no in-place ops
    return make_fx(functionalize(fn, remove="mutations_and_views"),
                   decomposition_table=core_aten_decompositions())(*inputs)


def sanitize(gm):
    """A copy of an AOTAutograd graph the converter takes whole (it
    refuses memory_format arguments): preserve_format is dropped,
    clone(memory_format=contiguous_format) becomes cat([x]) (also a
    contiguous copy), a Python number in a .Tensor overload's `other`
    uses the .Scalar overload, None outputs are dropped.
    Returns (gm, positions of the kept outputs)."""
    import copy
    gm = copy.deepcopy(gm)
    keep = None
    for n in gm.graph.nodes:
        if n.op == "call_function" and "memory_format" in n.kwargs:
            kw = dict(n.kwargs)
            if kw["memory_format"] == torch.preserve_format:
                del kw["memory_format"]
                n.kwargs = kw
            elif kw["memory_format"] == torch.contiguous_format and n.target == torch.ops.aten.clone.default:
                # a contiguous copy without the argument: cat of one tensor
                n.target = torch.ops.aten.cat.default
                n.args = ([n.args[0]], 0)
                n.kwargs = {}
        if (n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload)
                and n.target._overloadname == "Tensor" and len(n.args) == 2
                and isinstance(n.args[1], (int, float)) and not isinstance(n.args[1], bool)):
            alt = getattr(n.target.overloadpacket, "Scalar", None)
            if alt is not None:   # x + 1 on an int tensor (num_batches_tracked)
                n.target = alt
        if n.op == "output":
            outs = n.args[0]
            outs = outs if isinstance(outs, (tuple, list)) else [outs]
            keep = [i for i, o in enumerate(outs) if isinstance(o, torch.fx.Node)]
            n.args = (tuple(outs[i] for i in keep),)
    gm.recompile()
    return gm, keep
