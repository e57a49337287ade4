"""Child process of test_cuda.py: a graph on (fake) CUDA tensors through the
backend's setup, against libtccclient bound to the recording fake libcuda
($TCC_CUDA_LIBRARY), fake libcublas and fake libcudnn; prints a JSON report. With
TCC_CHILD_MODE=reduce-overhead each kernel is launched twice with the same
pointers (captured as a CUDA graph, then replayed)."""
import ctypes
import json
import os
import sys

import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

sys.path.insert(0, os.environ["TCC_PKG"])
from tccd import _lib, config, dynamo  # noqa: E402


def f(x, y, w):
    h = torch.sin(x) * y + 1
    return h, torch.relu(h @ w), h.t()


def f_index(cache, k, pos, target, base):
    """TCC_CHILD_GRAPH=index: a StaticCache's update at the decoded
    position (index_put with an integer index) and a loss backward's
    one-hot (scatter.value)."""
    upd = torch.ops.aten.index_put.default(cache, [None, None, pos], k)
    onehot = torch.ops.aten.scatter.value(base, 1, target, -1.0)
    return upd * 2, onehot


def f_write_rows(cache, k, pos):
    """TCC_CHILD_GRAPH=write: a StaticCache's update written into the
    cache itself (index_put_, as partition.write_in_place sends it), read
    after the write."""
    new = torch.ops.aten.index_put_.default(cache, [None, None, pos], k)
    return new * 2, new.sum(-1)


def f_conv(x, w, b):
    """TCC_CHILD_GRAPH=conv: a grouped, strided convolution with bias and
    a relu (a cuDNN step, then the epilogue kernel)."""
    return torch.relu(torch.nn.functional.conv2d(x, w, b, stride=2, padding=1, groups=2))


with FakeTensorMode(allow_non_fake_inputs=False):
    if os.environ.get("TCC_CHILD_GRAPH") == "conv":
        args = (torch.empty(2, 8, 9, 9, device="cuda"), torch.empty(12, 4, 3, 3, device="cuda"),
                torch.empty(12, device="cuda"))
        gm = make_fx(f_conv)(*args)
    elif os.environ.get("TCC_CHILD_GRAPH") == "write":
        args = (torch.empty(2, 3, 16, 4, device="cuda"), torch.empty(2, 3, 1, 4, device="cuda"),
                torch.empty(1, dtype=torch.int64, device="cuda"))
        gm = make_fx(f_write_rows)(*args)
    elif os.environ.get("TCC_CHILD_GRAPH") == "index":
        args = (torch.empty(2, 3, 16, 4, device="cuda"), torch.empty(2, 3, 1, 4, device="cuda"),
                torch.empty(1, dtype=torch.int64, device="cuda"),
                torch.empty(16, 1, dtype=torch.int64, device="cuda"), torch.empty(16, 4, device="cuda"))
        gm = make_fx(f_index)(*args)
    else:
        args = (torch.empty(8, 16, device="cuda"), torch.empty(8, 16, device="cuda"),
                torch.empty(16, 4, device="cuda"))
        gm = make_fx(f)(*args)

mode = os.environ.get("TCC_CHILD_MODE", "default")
cfg = config.Config.make(cuda="compile", mode=mode)
cg = dynamo._CompiledGraph(gm, "inference", cfg, False, False)
cg._built = cg._build()
cg._precompile()
report = {"device": cg.device, "target": cg.base.target.cuda_arch, "mode": mode,
          "partitions": len(cg.partitions), "kernels": []}
fake = ctypes.CDLL(os.environ["TCC_CUDA_LIBRARY"])
fake.fake_cuda_events.restype = ctypes.c_char_p
lib = _lib.load()
lib.tcc_rt_cuda_stream_create.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
for p in cg.partitions:
    report["views"] = p.assembly.n_views
    for k in p._kernels.values():
        # the fake driver's device memory is host memory: host buffers stand in
        ins = [torch.randn(s, dtype=dt) if dt.is_floating_point else torch.zeros(s, dtype=dt)
               for s, _, _, dt in k.input_specs]
        outs = [torch.empty_strided(s, st, dtype=dt) for s, st, dt in k.output_specs]
        ws = torch.empty(max(k.workspace_bytes, 1), dtype=torch.uint8)
        stream = ctypes.c_void_p()
        err = _lib.Error()
        assert lib.tcc_rt_cuda_stream_create(0, ctypes.byref(stream), err.ptr) == 0, err.message
        fake.fake_cuda_reset()
        for _ in range(2 if k.graphs else 1):
            k.launch_cuda([t.data_ptr() for t in ins], [o.data_ptr() for o in outs], ws.data_ptr(),
                          stream.value)
        report["kernels"].append({
            "device_type": k.device_type, "target": k.manifest.target,
            "names": [x.name for x in k.manifest.kernels],
            "kinds": [x.kind for x in k.manifest.kernels],
            "inputs": ["%x" % t.data_ptr() for t in ins],
            "workspace": "%x" % ws.data_ptr(), "workspace_bytes": k.workspace_bytes,
            "manifest_workspace_bytes": k.manifest.workspace_bytes,
            "outputs": ["%x" % o.data_ptr() for o in outs],
            "graphs": k.graphs, "stats": k.cuda_stats(),
            "events": fake.fake_cuda_events().decode().splitlines()})
print("REPORT " + json.dumps(report))
