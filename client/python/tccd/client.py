"""Client and Kernel: thin Python objects over libtccclient.

    c = Client("127.0.0.1:7311")          # connects (tcc_client_open)
    k, resp = c.get_kernel(request)       # compile + fetch + verify + load
    outs = k.run([x, y])                  # outputs allocated from the manifest

Everything that talks to the daemon, checks digests or loads code is the C
library's; this module encodes/decodes tcc.v1 messages (protobuf) and turns
error codes into TccdError subclasses. Tensors are passed by data pointer
(pointer to element 0 of the storage, as the CPU ABI wants), never copied.
"""
import ctypes
import os
import threading
import weakref

import torch

from . import _lib
from ._proto import tcc_pb2 as pb
from .dtypes import PB_TO_TORCH
from .errors import TccdCompileError, TccdError, TccdKernelError, error_for

DEFAULT_ADDR = "127.0.0.1:7311"

METHOD_COMPILE = "/tcc.v1.Compiler/Compile"
METHOD_OPS = "/tcc.v1.Compiler/Ops"
METHOD_STATS = "/tcc.v1.Cache/Stats"
METHOD_LIST = "/tcc.v1.Cache/List"
METHOD_SHOW = "/tcc.v1.Cache/Show"
METHOD_EXPLAIN = "/tcc.v1.Cache/Explain"


def default_addr():
    """$TCCD_ADDR, else 127.0.0.1:7311."""
    return os.environ.get("TCCD_ADDR") or DEFAULT_ADDR


def check_addr(addr, source="addr"):
    """Raises ValueError ("tccd: SOURCE: tccd address '...': what is
    wrong") unless libtccclient's tcc_client_addr_check accepts `addr`:
    HOST:PORT, [IPV6]:PORT, dns:///HOST:PORT or unix:PATH, PORT 1-65535.
    `source` says where the address came from ("addr", "TCCD_ADDR")."""
    if not isinstance(addr, str):
        raise ValueError(f"tccd: {source} must be a string like 127.0.0.1:7311, got {addr!r}")
    err = _lib.Error()
    if _lib.load().tcc_client_addr_check(addr.encode("utf-8", "surrogateescape"), err.ptr):
        raise ValueError(f"tccd: {source}: {err.message}")


class Client:
    """One connection to tccd (a tcc_client). Safe to share between threads;
    do not use it in a child after fork()."""

    def __init__(self, addr=None, *, deadline_ms=0, connect_timeout_ms=0, artifact_dir=None):
        lib = _lib.load()
        self.addr = addr or default_addr()
        self.deadline_ms = int(deadline_ms or 0)
        handle = ctypes.c_void_p()
        err = _lib.Error()
        rc = lib.tcc_client_open(self.addr.encode(), self.deadline_ms, int(connect_timeout_ms or 0),
                                 artifact_dir.encode() if artifact_dir else None,
                                 ctypes.byref(handle), err.ptr)
        if rc:
            raise error_for(rc, err.message, request_id=err.request_id, addr=self.addr, what="connect")
        self._h = handle
        self._close = lib.tcc_client_close
        self.pid = os.getpid()

    def close(self):
        if getattr(self, "_h", None):
            self._close(self._h)
            self._h = None

    def __del__(self):
        # A client inherited through fork() belongs to the parent.
        if getattr(self, "pid", None) == os.getpid():
            self.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _handle(self):
        if not getattr(self, "_h", None):
            raise TccdError("client is closed", status="FAILED_PRECONDITION", addr=self.addr)
        return self._h

    # ---------------------------------------------------------------- calls

    def call(self, method, request, response_cls, *, deadline_ms=0, what=None, default=TccdError):
        """A unary call: encodes `request`, decodes the answer as
        `response_cls`. Raises a TccdError subclass on failure."""
        lib = _lib.load()
        data = request.SerializeToString()
        buf, n = _lib._c_u8_p(), ctypes.c_size_t()
        err = _lib.Error()
        rc = lib.tcc_client_call(self._handle(), method.encode(), data, len(data),
                                 ctypes.byref(buf), ctypes.byref(n), int(deadline_ms or 0), err.ptr)
        if rc:
            raise error_for(rc, err.message, request_id=err.request_id, addr=self.addr,
                            what=what or method, default=default)
        resp = response_cls()
        resp.ParseFromString(_lib.take_bytes(buf, n))
        return resp

    def compile(self, request):
        """Compile only (no fetch): the CompileResponse."""
        return self.call(METHOD_COMPILE, request, pb.CompileResponse, what="compile",
                         default=TccdCompileError)

    def get_kernel(self, request):
        """Compile + fetch + verify + load: (Kernel, CompileResponse)."""
        lib = _lib.load()
        prepare_kernel_runtime()
        data = request.SerializeToString()
        kh = ctypes.c_void_p()
        buf, n = _lib._c_u8_p(), ctypes.c_size_t()
        err = _lib.Error()
        rc = lib.tcc_client_get_module_bytes(self._handle(), data, len(data), ctypes.byref(kh),
                                             ctypes.byref(buf), ctypes.byref(n), err.ptr)
        if rc:
            raise error_for(rc, err.message, request_id=err.request_id, addr=self.addr, what="compile",
                            default=TccdCompileError)
        resp = pb.CompileResponse()
        try:
            resp.ParseFromString(_lib.take_bytes(buf, n))
        except Exception:
            lib.tcc_module_unload(kh)
            raise
        return Kernel(kh, resp.manifest, addr=self.addr, guard_hash=resp.guard_hash), resp

    def ops(self, device=pb.CPU):
        """Compiler.Ops: what the daemon compiles for `device`."""
        return self.call(METHOD_OPS, pb.OpsRequest(device=device), pb.OpsResponse, what="ops")

    def stats(self):
        return self.call(METHOD_STATS, pb.StatsRequest(), pb.StatsResponse, what="stats")

    def explain(self, guard_hash=None, request=None, max_nearest=0):
        """Cache.Explain: why a key missed. Give the guard hash of a stored
        entry, a recorded failure or a recent miss, or the CompileRequest
        itself; returns the ExplainResponse (the nearest stored keys of the
        same graph and the components that differ)."""
        req = pb.ExplainRequest(max_nearest=max_nearest)
        if request is not None:
            req.request.CopyFrom(request)
        else:
            req.guard_hash = guard_hash or ""
        return self.call(METHOD_EXPLAIN, req, pb.ExplainResponse, what="explain")

    def get_plan(self, key):
        """Cache.GetPlan: the plan the daemon keeps for `key`, as
        (encoded tcc.v1.Plan bytes, CacheStatus: pb.HIT or pb.REMOTE_HIT),
        or None when neither the daemon nor its remote tier has one. With
        TCCD_TRUSTED_KEYS set, libtccclient has verified its signature
        first (an unsigned or badly signed plan raises PERMISSION_DENIED);
        decoding and checking the plan itself is the caller's."""
        lib = _lib.load()
        buf, n = _lib._c_u8_p(), ctypes.c_size_t()
        status = ctypes.c_int()
        err = _lib.Error()
        rc = lib.tcc_client_get_plan_bytes(self._handle(), key.encode("utf-8", "surrogateescape"),
                                           ctypes.byref(buf), ctypes.byref(n), ctypes.byref(status),
                                           err.ptr)
        if rc == -5:  # NOT_FOUND: no plan yet
            return None
        if rc:
            raise error_for(rc, err.message, request_id=err.request_id, addr=self.addr,
                            what="get plan")
        return _lib.take_bytes(buf, n), status.value

    def put_plan(self, plan):
        """Cache.PutPlan: hands a pb.Plan (or a whole pb.PutPlanRequest)
        to the daemon, which checks, signs and keeps it. True when it
        stored it, False when it keeps one for that key already (the first
        writer wins). A kernel the daemon has not compiled raises
        FAILED_PRECONDITION, a malformed plan INVALID_ARGUMENT."""
        req = plan if isinstance(plan, pb.PutPlanRequest) else pb.PutPlanRequest(plan=plan)
        data = req.SerializeToString()
        stored = ctypes.c_int()
        err = _lib.Error()
        rc = _lib.load().tcc_client_put_plan_bytes(self._handle(), data, len(data), ctypes.byref(stored),
                                                   err.ptr)
        if rc:
            raise error_for(rc, err.message, request_id=err.request_id, addr=self.addr,
                            what="put plan")
        return bool(stored.value)

    def health(self, service=""):
        """The grpc.health.v1 serving status (1 = SERVING)."""
        lib = _lib.load()
        st = ctypes.c_int()
        err = _lib.Error()
        rc = lib.tcc_client_health(self._handle(), service.encode(), ctypes.byref(st), err.ptr)
        if rc:
            raise error_for(rc, err.message, request_id=err.request_id, addr=self.addr, what="health")
        return st.value


_runtime_lock = threading.Lock()
_runtime_ready = False
KERNEL_RUNTIME_LIBS = ("libopenblas.so.0",)


def prepare_kernel_runtime():
    """Threads of the kernels' BLAS: $TCCD_KERNEL_THREADS (default 1; 0 =
    leave it alone).

    Kernels call the system's OpenBLAS, whose thread pool fights PyTorch's
    threads for the cores (on 2 cores a GPT block step took 34 ms instead of
    2-3 ms). Before the first kernel is loaded, OpenBLAS is loaded with
    OPENBLAS_NUM_THREADS / OMP_NUM_THREADS set for its initialisation only
    (then the environment is restored; variables the user set win); kernels
    bind to that initialised copy. (Their OpenMP loops run on the libgomp
    PyTorch already loaded, soname libgomp.so.1, so there is one OpenMP
    runtime.)"""
    global _runtime_ready
    if _runtime_ready:
        return
    with _runtime_lock:
        if _runtime_ready:
            return
        want = os.environ.get("TCCD_KERNEL_THREADS", "1")
        if want.strip() not in ("", "0"):
            saved = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
            try:
                for k, v in saved.items():
                    if v is None:
                        os.environ[k] = want
                for name in KERNEL_RUNTIME_LIBS:
                    try:
                        ctypes.CDLL(name)
                    except OSError:
                        pass
            finally:
                for k, v in saved.items():
                    if v is None:
                        os.environ.pop(k, None)
        _runtime_ready = True


def _empty_strided_cpu_py(sizes, strides, dtype):
    return torch.empty_strided(sizes, strides, dtype=dtype)


try:   # the allocation Inductor's wrappers use: no Python argument parsing (2 vs 3.6 us)
    from torch._C._dynamo.guards import _empty_strided_cpu
except ImportError:
    _empty_strided_cpu = _empty_strided_cpu_py


# Outputs of at least this many bytes keep their storage for the next
# call (_LargeOutput). glibc's malloc maps any block over 32 MB afresh on
# every allocation (its mmap threshold stops growing there), so without
# this each call of a kernel with such an output faulted its pages in
# again: BERT-base training's logits and its vocabulary-sized weight
# gradients, 350 MB of zeroed pages a step.
LARGE_OUTPUT_BYTES = 32 << 20


class _LargeOutput:
    """A kernel output of LARGE_OUTPUT_BYTES or more: each call gets a new
    tensor on the storage of the call before when no tensor holds that
    storage any more (its use count is this object's alone; a view, an
    autograd saved tensor or a caller's reference keeps it), else on a
    new one, kept for the next call. So a training step's large outputs
    land in the pages of the step before, already mapped. The kernel
    writes every element of its outputs, as it does into a new tensor."""

    def __init__(self, size, stride, dtype):
        self.size, self.stride, self.dtype = tuple(size), tuple(stride), dtype
        self.storage = None
        self.lock = threading.Lock()   # two threads never get one storage

    def __call__(self):
        with self.lock:
            st = self.storage
            if st is not None and _storage_use_count(st._cdata) == 1:
                return torch.empty(0, dtype=self.dtype).set_(st, 0, self.size, self.stride)
            t = _empty_strided_cpu(self.size, self.stride, self.dtype)
            self.storage = t.untyped_storage()
            return t


_storage_use_count = getattr(torch._C, "_storage_Use_Count", None)


def _output_allocator(size, stride, dtype):
    """What allocates an output of these sizes, strides and dtype on each
    call: a _LargeOutput for the large ones, else None (a new tensor)."""
    n = 1 + sum((d - 1) * st for d, st in zip(size, stride)) if all(d > 0 for d in size) else 0
    nbytes = n * torch.empty(0, dtype=dtype).element_size()
    return _LargeOutput(size, stride, dtype) if _storage_use_count and nbytes >= LARGE_OUTPUT_BYTES else None


_scratch = threading.local()


def _workspace(nbytes):
    """A 64-byte aligned CPU workspace of at least nbytes: the calling
    thread's scratch buffer, grown when too small and reused by every CPU
    kernel this thread runs after (a thread runs one kernel at a time and
    nothing in a workspace outlives the run). Allocating it per call cost a
    fresh mmap and its page faults for the large ones (a convolution's
    im2col columns) on every step."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < nbytes + 64:
        buf = _scratch.buf = torch.empty(nbytes + 64, dtype=torch.uint8)
    return (buf.data_ptr() + 63) & ~63


class Kernel:
    """A loaded artifact (tcc_module). run() may be called from several
    threads at once. Unloaded when garbage-collected."""

    def __init__(self, handle, manifest, *, addr=None, guard_hash=""):
        self._h = handle
        self._unload = _lib.load().tcc_module_unload
        self._run = _lib.load().tcc_module_run
        self.manifest = manifest
        self.addr = addr
        self.guard_hash = guard_hash
        self.n_inputs = len(manifest.inputs)
        self.n_outputs = len(manifest.outputs)
        self.workspace_bytes = int(manifest.workspace_bytes)
        self._in_t = ctypes.c_void_p * max(self.n_inputs, 1)
        self._out_t = ctypes.c_void_p * max(self.n_outputs, 1)
        specs = []
        for m in manifest.outputs:
            if m.dtype not in PB_TO_TORCH:
                raise TccdKernelError(f"manifest output dtype {m.dtype} has no torch dtype",
                                      status="INVALID_ARGUMENT", addr=addr, what="load")
            if m.storage_offset != 0:
                raise TccdKernelError("manifest output with a storage offset",
                                      status="INVALID_ARGUMENT", addr=addr, what="load")
            specs.append((tuple(m.sizes), tuple(m.strides), PB_TO_TORCH[m.dtype]))
        self.output_specs = specs
        self._large = [_output_allocator(*spec) for spec in specs]   # per output: a _LargeOutput or None
        self._any_large = any(self._large)
        self.input_specs = [(tuple(m.sizes), tuple(m.strides), int(m.storage_offset),
                             PB_TO_TORCH.get(m.dtype)) for m in manifest.inputs]
        # ABI 2 (dynamic shapes): layouts are polynomials over symbols bound
        # from the actual inputs (libtccclient checks the guards).
        self.symbols = list(manifest.symbols) if manifest.abi_version == 2 else []
        self.dynamic = bool(self.symbols)
        self._out_ranks = [len(m.sizes) for m in manifest.outputs]
        self._in_dtypes = [PB_TO_TORCH.get(m.dtype) for m in manifest.inputs]
        self._in_offset_bytes = [
            off * (dt.itemsize if dt is not None else 0)
            for (_, _, off, dt) in self.input_specs]
        # A CUDA artifact (cubin): launched with tcc_rt_cuda_kernel_launch on
        # a stream, with device pointers (libtccclient's Driver API loader,
        # in the thread's current context: PyTorch's for its device).
        self._cuda = _lib.load().tcc_module_cuda(handle) or None
        self.device_type = "cuda" if self._cuda else "cpu"
        self.graphs = False              # launches as CUDA graphs (use_graphs)
        if self._cuda:
            _cuda_kernels.add(self)
            # the plan's workspace, then what its cuDNN steps chose at load
            self.workspace_bytes = int(_lib.load().tcc_rt_cuda_kernel_workspace_bytes(self._cuda))

    def __del__(self):
        h = getattr(self, "_h", None)
        if h:
            self._unload(h)
            self._h = None

    def check_inputs(self, inputs):
        """Raises ValueError unless `inputs` match the manifest's layouts."""
        if len(inputs) != self.n_inputs:
            raise ValueError(f"kernel takes {self.n_inputs} inputs, got {len(inputs)}")
        for i, (t, (sizes, strides, off, dt)) in enumerate(zip(inputs, self.input_specs)):
            got = (tuple(t.shape), t.stride(), t.storage_offset(), t.dtype)
            if got != (sizes, strides, off, dt) or t.device.type != self.device_type:
                raise ValueError(f"input {i}: kernel wants sizes {sizes} strides {strides} "
                                 f"offset {off} {dt} on {self.device_type}, got {got[0]} {got[1]} {got[2]} "
                                 f"{got[3]} on {t.device}")

    def bind(self, inputs):
        """Dynamic kernels: the symbols' values for `inputs` (a ctypes int64
        array). Raises TccdKernelError (status FAILED_PRECONDITION, "guard
        failed: ...") when the inputs do not satisfy the kernel's guards."""
        if len(inputs) != self.n_inputs:
            raise ValueError(f"kernel takes {self.n_inputs} inputs, got {len(inputs)}")
        for i, (t, dt) in enumerate(zip(inputs, self._in_dtypes)):
            if t.dtype != dt or t.device.type != "cpu":
                raise ValueError(f"input {i}: kernel wants {dt} on cpu, got {t.dtype} on {t.device}")
        sizes = [int(s) for t in inputs for s in t.shape]
        strides = [int(s) for t in inputs for s in t.stride()]
        arr = ctypes.c_int64 * max(len(sizes), 1)
        offs = (ctypes.c_int64 * max(len(inputs), 1))(*[t.storage_offset() for t in inputs])
        syms = (ctypes.c_int64 * max(len(self.symbols), 1))()
        err = _lib.thread_error()
        rc = _lib.load().tcc_module_bind(self._h, arr(*sizes), arr(*strides), offs, syms, err.ptr)
        if rc:
            raise error_for(rc, err.message, addr=self.addr, what="bind", default=TccdKernelError)
        return syms

    def accepts(self, inputs):
        """True when a dynamic kernel's guards admit `inputs`."""
        try:
            self.bind(inputs)
            return True
        except (TccdError, ValueError):
            return False

    def _run_dynamic(self, inputs):
        lib = _lib.load()
        syms = self.bind(inputs)
        err = _lib.thread_error()
        outs = []
        for o, (rank, (_, _, dt)) in enumerate(zip(self._out_ranks, self.output_specs)):
            sz = (ctypes.c_int64 * max(rank, 1))()
            st = (ctypes.c_int64 * max(rank, 1))()
            rc = lib.tcc_module_output_layout(self._h, syms, o, sz, st, err.ptr)
            if rc:
                raise error_for(rc, err.message, addr=self.addr, what="run",
                                default=TccdKernelError)
            outs.append(torch.empty_strided(tuple(sz[:rank]), tuple(st[:rank]), dtype=dt))
        ins = self._in_t(*[t.data_ptr() - t.storage_offset() * t.element_size() for t in inputs])
        outp = self._out_t(*[o.data_ptr() for o in outs])
        nbytes = int(lib.tcc_module_workspace_bytes(self._h, syms))
        wp = _workspace(nbytes) if nbytes else None
        rc = lib.tcc_module_run_sym(self._h, ins, outp, wp, syms, err.ptr)
        if rc:
            raise error_for(rc, err.message, addr=self.addr, what="run", default=TccdKernelError)
        return outs

    def run(self, inputs, check=True):
        """Runs on CPU tensors laid out as the manifest says; returns the
        outputs (new tensors, allocated with the manifest's sizes/strides).
        A dynamic kernel (ABI 2) takes any inputs its guards admit."""
        if self.dynamic:
            return self._run_dynamic(inputs)
        if check:
            self.check_inputs(inputs)
        if self._cuda:
            return self._run_cuda(inputs)
        if self._any_large:
            outs = [lg() if lg else _empty_strided_cpu(*spec) for lg, spec in zip(self._large, self.output_specs)]
        else:
            outs = [_empty_strided_cpu(s, st, dt) for s, st, dt in self.output_specs]
        # the storage offsets are the manifest's (checked above, or by the
        # caller's signature)
        ins = self._in_t(*[t.data_ptr() - o for t, o in zip(inputs, self._in_offset_bytes)])
        outp = self._out_t(*[o.data_ptr() for o in outs])
        wp = _workspace(self.workspace_bytes) if self.workspace_bytes else None
        err = _lib.thread_error()
        rc = self._run(self._h, ins, outp, wp, err.ptr)
        if rc:
            raise error_for(rc, err.message, addr=self.addr, what="run", default=TccdKernelError)
        return outs

    def signature_runner(self, check, offsets, miss=None):
        """A runner for one input signature: run(*inputs) returns the
        outputs, as run(inputs, check=False) does, when `check` (torch's
        TensorGuards.check, for dtype, device, sizes and strides) passes
        and the storage offsets are `offsets`; otherwise miss(*inputs), or
        None (nothing run) without a `miss`.
        Generated for this kernel's arity, so that a call is one Python
        frame: no comprehension (each is a frame of its own before Python
        3.12), no attribute lookups (scripts/bench-overhead). None for
        kernels it does not cover (dynamic shapes, CUDA)."""
        if self.dynamic or self._cuda or len(offsets) != self.n_inputs:
            return None
        ins = [f"a{i}" for i in range(self.n_inputs)]
        cond = [f"check({', '.join(ins)})"] + [f"{a}.storage_offset() == {int(o)}"
                                               for a, o in zip(ins, offsets)]
        ptrs = [f"{a}.data_ptr() - {int(o)}" if o else f"{a}.data_ptr()"
                for a, o in zip(ins, self._in_offset_bytes)]
        outs = [f"o{j}" for j in range(self.n_outputs)]
        n_in = self.n_inputs
        src = [f"def run({', '.join(ins)}):",
               f"    if not ({' and '.join(cond)}):",
               f"        return {'miss(' + ', '.join(ins) + ')' if miss else 'None'}"]
        large = self._large
        src += [f"    o{j} = large[{j}]()" if large[j] else f"    o{j} = empty(S[{j}], T[{j}], D[{j}])"
                for j in range(self.n_outputs)]
        # The pointer arrays are the calling thread's own (frame()), written
        # in place: the kernel runs with the GIL released, so another thread
        # may be in this runner at the same time.
        src += ["    try:",
                "        p, pin, pout, ep, err = mine.frame",
                "    except AttributeError:",
                "        p, pin, pout, ep, err = frame()"]
        src += [f"    p[{i}] = {ptr}" for i, ptr in enumerate(ptrs)]
        src += [f"    p[{n_in + j}] = {o}.data_ptr()" for j, o in enumerate(outs)]
        src += [f"    rc = entry(h, pin, pout, {'workspace(W)' if self.workspace_bytes else 'None'}, ep)",
                "    if rc:",
                "        fail(rc, err)",
                f"    return [{', '.join(outs)}]"]
        mine = threading.local()
        n_ptrs = n_in + self.n_outputs

        def frame():
            p = (ctypes.c_void_p * max(n_ptrs, 1))()
            base = ctypes.addressof(p)
            err = _lib.thread_error()
            mine.frame = f = (p, base, base + ctypes.sizeof(ctypes.c_void_p) * n_in, err.ptr, err)
            return f

        env = {"check": check, "miss": miss, "empty": _empty_strided_cpu, "large": large, "mine": mine, "frame": frame,
               "entry": _lib.run_by_address(), "h": self._h, "workspace": _workspace,
               "W": self.workspace_bytes, "fail": self._fail, "kernel": self,   # kept alive
               "S": [s for s, _, _ in self.output_specs], "T": [t for _, t, _ in self.output_specs],
               "D": [d for _, _, d in self.output_specs]}
        exec(compile("\n".join(src), f"<tccd kernel {self.guard_hash[:16]}>", "exec"), env)
        return env["run"]

    def _fail(self, rc, err):
        raise error_for(rc, err.message, addr=self.addr, what="run", default=TccdKernelError)

    # ---------------------------------------------------------------- CUDA

    def launch_cuda(self, in_ptrs, out_ptrs, workspace_ptr, stream):
        """Launches a CUDA artifact's launch plan on `stream` (a CUstream as an int;
        0 = the legacy default stream) with device pointers: each input's
        storage base (data_ptr - storage_offset * element size), each
        output, the workspace (self.workspace_bytes: the manifest's, plus
        what cuDNN steps need; 0 when none).
        Asynchronous. Raises TccdKernelError."""
        if not self._cuda:
            raise TccdKernelError("not a CUDA kernel", status="INVALID_ARGUMENT",
                                  addr=self.addr, what="run")
        ins = self._in_t(*in_ptrs)
        outs = self._out_t(*out_ptrs)
        err = _lib.thread_error()
        rc = _lib.load().tcc_rt_cuda_kernel_launch(self._cuda, stream or None, ins, outs,
                                                workspace_ptr or None, err.ptr)
        if rc:
            raise error_for(rc, err.message, addr=self.addr, what="run", default=TccdKernelError)

    def use_graphs(self, on=True):
        """Mode reduce-overhead: launch the plan as a CUDA graph, captured on
        the first launch with a set of pointers and replayed (one
        cuGraphLaunch) on later launches with the same ones (the runtime
        keeps 16 per kernel). PyTorch's caching allocator hands a steady
        loop the same blocks, so each call replays."""
        if not self._cuda:
            return
        _lib.load().tcc_rt_cuda_kernel_set_graphs(self._cuda, 1 if on else 0)
        self.graphs = bool(on)

    def cuda_stats(self):
        """{direct_launches, graph_captures, graph_replays} of a CUDA kernel."""
        if not self._cuda:
            return {}
        st = _CudaStats()
        _lib.load().tcc_rt_cuda_kernel_stats(self._cuda, ctypes.byref(st))
        return {"direct_launches": st.direct_launches, "graph_captures": st.graph_captures,
                "graph_replays": st.graph_replays}

    def _run_cuda(self, inputs):
        """Outputs and workspace on the inputs' device, launched on
        PyTorch's current stream there (ordered with the eager ops around
        it, like any CUDA op). A graph cannot be captured on the legacy
        default stream (PyTorch's current stream unless the caller set
        one): with graphs on, the plan runs on a side stream that waits for
        the current one, and the current one waits for it (so the caching
        allocator's reuse of these blocks stays ordered after the launch)."""
        device = inputs[0].device if inputs else torch.device("cuda", torch.cuda.current_device())
        outs = [torch.empty_strided(s, st, dtype=dt, device=device)
                for s, st, dt in self.output_specs]
        ws = None
        if self.workspace_bytes:
            ws = torch.empty(self.workspace_bytes, dtype=torch.uint8, device=device)
        cur = torch.cuda.current_stream(device)
        args = ([t.data_ptr() - t.storage_offset() * t.element_size() for t in inputs],
                [o.data_ptr() for o in outs], ws.data_ptr() if ws is not None else 0)
        if self.graphs and cur.cuda_stream == 0:
            side = _graph_stream(device)
            side.wait_stream(cur)
            self.launch_cuda(*args, side.cuda_stream)
            cur.wait_stream(side)
        else:
            self.launch_cuda(*args, cur.cuda_stream)
        return outs


class _CudaStats(ctypes.Structure):
    """tcc_rt_cuda_stats (runtime/tcc_runtime.h)."""
    _fields_ = [("direct_launches", ctypes.c_uint64), ("graph_captures", ctypes.c_uint64),
                ("graph_replays", ctypes.c_uint64), ("from_ptx", ctypes.c_int),
                ("device", ctypes.c_int), ("device_arch", ctypes.c_char * 16)]


_cuda_kernels = weakref.WeakSet()     # loaded CUDA kernels, for cuda_launch_stats()
_graph_streams = {}                   # device index -> side stream for graph launches
_graph_streams_lock = threading.Lock()


def _graph_stream(device):
    idx = device.index if device.index is not None else torch.cuda.current_device()
    s = _graph_streams.get(idx)
    if s is None:
        with _graph_streams_lock:
            s = _graph_streams.get(idx)
            if s is None:
                s = _graph_streams[idx] = torch.cuda.Stream(device=idx)
    return s


def cuda_launch_stats():
    """Summed over the CUDA kernels loaded now: {direct_launches,
    graph_captures, graph_replays}."""
    tot = {"direct_launches": 0, "graph_captures": 0, "graph_replays": 0}
    for k in list(_cuda_kernels):
        for key, v in k.cuda_stats().items():
            tot[key] += v
    return tot


def cuda_device_arch(index=0):
    """The arch ("sm_90") and name of CUDA device `index`, as libtccclient's
    Driver API loader sees it. Raises TccdError (FAILED_PRECONDITION: no
    driver or no device)."""
    arch = ctypes.create_string_buffer(16)
    name = ctypes.create_string_buffer(256)
    err = _lib.Error()
    rc = _lib.load().tcc_rt_cuda_device_arch(int(index), arch, name, len(name), err.ptr)
    if rc:
        raise error_for(rc, err.message, what="cuda")
    return arch.value.decode(), name.value.decode(errors="replace")
