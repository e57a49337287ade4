"""Gradients at ReLU's kink: the float64 reference with a chosen side.

ReLU's derivative jumps at 0. An activation that float64 puts at +1e-6
can come out of any float32 program (eager's or tccd's, summing in
another order) at -1e-6, and then that element's gradient is dropped:
one element, but batch norm's backward spreads it over its channel and
on to every parameter upstream, by far more than a float32 tolerance.
Neither side is wrong; the gradient is ill-conditioned there.

`explain_by_relu_kinks` decides whether a float32 model's gradients are
those of the float64 model for some choice of side at the activations
that lie within KINK of 0: it finds those activations (a TorchFunctionMode
that replaces relu by x * mask in the float64 model), then tries the
flips of the nearest few, smallest sets first, each an exact float64
forward and backward. Anything else -- a wrong kernel, a wrong sum --
moves the gradients in ways no flip explains, and is still caught.
"""
import copy
import itertools

import torch
import torch.nn.functional as F

KINK = 2e-5        # |activation| below this (float64) may fall on either side in float32
MAX_FLIPPED = 6    # the nearest this many kinks are tried, in all 2**6 combinations

_RELUS = {F.relu, torch.relu, torch.Tensor.relu}


class ReluKinks(torch.overrides.TorchFunctionMode):
    """Runs ReLUs as x * mask, the mask flipped at the (call, flat index)
    pairs in `flips`; records the activations within KINK of 0."""

    def __init__(self, flips=()):
        super().__init__()
        self.flips = set(flips)
        self.calls = 0
        self.kinks = []    # (|x|, call, flat index)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in _RELUS:
            return func(*args, **kwargs)
        x = args[0] if args else kwargs["input"]
        call = self.calls
        self.calls += 1
        flat = x.detach().reshape(-1)
        near = (flat.abs() < KINK).nonzero().flatten().tolist()
        self.kinks += [(abs(flat[i].item()), call, i) for i in near]
        mask = (flat > 0).clone()
        for c, i in self.flips:
            if c == call:
                mask[i] = ~mask[i]
        return x * mask.reshape(x.shape).to(x.dtype)


def _grads64(model64, run_loss, flips):
    model64.zero_grad(set_to_none=True)
    mode = ReluKinks(flips)
    with mode:
        loss = run_loss(model64)
    loss.backward()
    return [p.grad for p in model64.parameters()], mode.kinks


def _close(got, want, tol):
    return all(torch.allclose(g.double(), w.double(), **tol) for g, w in zip(got, want))


def explain_by_relu_kinks(model64, run_loss, grads, tol):
    """(True, which flips) when `grads` (the float32 model's, in parameter
    order) match float64's within `tol` for some sides taken at ReLU
    kinks; (False, why not) otherwise. `run_loss(model64)` runs the
    float64 forward and returns the loss. model64 is left as it was (its
    copy runs)."""
    model64 = copy.deepcopy(model64)
    base, kinks = _grads64(model64, run_loss, ())
    if _close(grads, base, tol):
        return True, "float64 itself (no flip)"
    kinks = sorted(kinks)[:MAX_FLIPPED]
    where = [(c, i) for _, c, i in kinks]
    for k in range(1, len(where) + 1):
        for flips in itertools.combinations(where, k):
            got, _ = _grads64(model64, run_loss, flips)
            if _close(grads, got, tol):
                near = {(c, i): a for a, c, i in kinks}
                return True, ", ".join(f"relu call {c} element {i} (float64 {near[(c, i)]:.2g})"
                                       for c, i in flips)
    return False, (f"no choice of side at the {len(where)} ReLU activations within {KINK} "
                   f"of 0 matches")
