"""Target specs, and pre-warming from Python: compile a model's graphs
for targets this process does not have.

    report = tccd.prewarm(model, example_inputs, targets=["cpu:x86-64-v4", "cuda:sm_90"])
    report["cuda:sm_90"]   # {"compiled": 12, "present": 3, "failed": 0, "errors": []}

The model runs once through a fresh tccd backend (forward, and backward
with backward=True, whose gradients are put back as they were), so its
graphs are traced and compiled as a job would compile them. Every kernel
request the backend sends is sent once more per target, retargeted: the
target replaced, the graph's tensors moved to its device type. Those
compiles only fill the daemon's cache (nothing is fetched or loaded), so
a job on a node of that target then starts with hits. Cross-target
compiles need no device: a CPU-only machine warms CUDA archs through the
daemon's NVRTC.

The graphs are those this process traces: a CUDA job traced on its GPU
may partition or specialise differently (another device's ops, dtypes
under autocast), so warming a CUDA fleet from a CPU trace fills what the
CPU trace asks for. `tcctl warm` warms from what jobs really sent.

A target spec is cpu, cpu:ISA[+FEATURE...] (x86-64, x86-64-v2, -v3, -v4)
or cuda:sm_XX, as tcctl takes it.
"""
import re
import threading

from ._proto import tcc_pb2 as pb

__all__ = ["prewarm", "retarget"]

_SPEC = re.compile(r"^(cpu(:[A-Za-z0-9_.-]+(\+[A-Za-z0-9_]+)*)?|cuda:sm_[0-9]{2,3}[a-z]?)$")
_ERRORS_KEPT = 5

_lock = threading.Lock()
_active = None          # {spec: counts} while a prewarm runs its model


def _target_of(spec):
    if not isinstance(spec, str) or not _SPEC.match(spec):
        raise ValueError(f"tccd.prewarm: a target is cpu, cpu:ISA[+FEATURE...] or cuda:sm_XX, got {spec!r}")
    kind, _, rest = spec.partition(":")
    if kind == "cuda":
        return pb.Target(device=pb.CUDA, cuda_arch=rest)
    isa, *features = rest.split("+") if rest else ("",)
    return pb.Target(device=pb.CPU, cpu_isa=isa, cpu_features=features)


def retarget(request, spec):
    """A copy of CompileRequest `request` for target `spec`: its target
    replaced and every tensor value moved to the target's device type."""
    target = _target_of(spec)
    out = pb.CompileRequest()
    out.CopyFrom(request)
    out.target.CopyFrom(target)
    for v in out.graph.values:
        if v.HasField("meta"):
            v.meta.device.type = target.device
    return out


def note_request(client, request):
    """Called by the backend for each kernel request while a prewarm runs:
    compiles it for every prewarm target (errors are counted, not raised)."""
    with _lock:
        active = _active
    if active is None:
        return
    from .errors import TccdError
    for spec, counts in active.items():
        try:
            resp = client.compile(retarget(request, spec))
            key = "compiled" if resp.cache == pb.MISS else "present"
        except TccdError as e:
            key = "failed"
            with _lock:
                if len(counts["errors"]) < _ERRORS_KEPT:
                    counts["errors"].append(f"{e.status}: {e.message}")
        with _lock:
            counts[key] += 1


def _grads(model, inputs):
    """The .grad of every parameter and leaf input, as copies, to put back."""
    import torch
    ts = [p for p in model.parameters() if p.requires_grad]
    ts += [t for t in inputs if isinstance(t, torch.Tensor) and t.requires_grad and t.is_leaf]
    return [(t, None if t.grad is None else t.grad.detach().clone()) for t in ts]


def prewarm(model, example_inputs, targets, *, backward=False, **options):
    """Compiles `model`'s graphs for each of `targets` (specs), running it
    once on `example_inputs` through tccd.backend(**options). Returns
    {spec: {"compiled", "present", "failed": counts, "errors": [first
    messages]}}; a target's failures are reported there, not raised.
    backward=True also runs a backward pass (the sum of the floating
    outputs) for the training graphs, then restores every gradient."""
    global _active
    import torch
    from .dynamo import backend
    specs = list(dict.fromkeys(targets))
    for s in specs:
        _target_of(s)
    inputs = tuple(example_inputs) if isinstance(example_inputs, (list, tuple)) else (example_inputs,)
    report = {s: {"compiled": 0, "present": 0, "failed": 0, "errors": []} for s in specs}
    compiled = torch.compile(model, backend=backend(**options))   # a fresh backend: Dynamo traces again
    saved = _grads(model, inputs) if backward else []
    with _lock:
        if _active is not None:
            raise RuntimeError("tccd.prewarm is already running in this process")
        _active = report
    try:
        out = compiled(*inputs)
        if backward:
            flat = out if isinstance(out, (list, tuple)) else [out]
            if isinstance(out, dict):
                flat = list(out.values())
            loss = sum(o.float().sum() for o in flat
                       if isinstance(o, torch.Tensor) and o.requires_grad and o.is_floating_point())
            if isinstance(loss, torch.Tensor):
                loss.backward()
    finally:
        with _lock:
            _active = None
        for t, g in saved:
            t.grad = g
    return report
