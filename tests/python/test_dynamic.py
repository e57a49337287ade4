"""Dynamic shapes end to end: torch.compile(..., dynamic=True) sends the
batch dim as a symbol, the daemon compiles one ABI 2 kernel per partition,
and that kernel serves every batch size its guards admit (no further
daemon compile), forward and backward.

Tolerances: outputs and gradients against a float64 copy of the model
(float32 kernels: rtol 1e-4, atol 1e-5, the package's usual F32 bounds)."""
import copy

import pytest
import torch

import tccd

F32 = dict(rtol=1e-4, atol=1e-5)
BATCHES = (3, 5, 17)


def _compiles(d):
    return int(d.stats().get("compiles", 0))


def _check_model(d, model, make_input, train):
    ref = copy.deepcopy(model).double()
    cm = torch.compile(model, backend="tccd", dynamic=True)
    after_first = None
    for n in BATCHES:
        x = make_input(n)
        xr = x.detach().double().requires_grad_(train)
        if train:
            x.requires_grad_(True)
            out = cm(x)
            out.square().sum().backward()
            want = ref(xr)
            want.square().sum().backward()
            torch.testing.assert_close(x.grad.double(), xr.grad, **F32)
            for p, pr in zip(model.parameters(), ref.parameters()):
                torch.testing.assert_close(p.grad.double(), pr.grad, **F32)
                p.grad = None
                pr.grad = None
        else:
            with torch.no_grad():
                out, want = cm(x), ref(xr)
        torch.testing.assert_close(out.detach().double(), want.detach(), **F32)
        if after_first is None:
            after_first = _compiles(d)
    assert after_first >= 1
    s = tccd.stats()
    assert s["dynamic_kernels"] >= 1, s
    # every kernel is a dynamic one, and batches 5 and 17 compiled nothing
    assert s["kernels"] == s["dynamic_kernels"], s
    assert _compiles(d) == after_first, (after_first, d.stats())
    # views whose result leaves a partition (a weight's t() kept for the
    # backward) run eagerly, as with static shapes; the rest is compiled
    assert s["compiled_ops"] > s["fallback_ops"], s
    return s


def test_mlp_inference_one_kernel_for_all_batches(own_daemon):
    d = own_daemon()
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 7))
    s = _check_model(d, m, lambda n: torch.randn(n, 16), train=False)
    assert s["graphs"] == 1


def test_mlp_training_forward_and_backward(own_daemon):
    d = own_daemon()
    m = torch.nn.Sequential(torch.nn.Linear(12, 24), torch.nn.Tanh(), torch.nn.Linear(24, 5))
    s = _check_model(d, m, lambda n: torch.randn(n, 12), train=True)
    kinds = {g["kind"] for g in s["graphs_detail"]}
    assert kinds == {"forward", "backward"}, kinds


class NormSoftmax(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(24)
        self.fc = torch.nn.Linear(24, 10)

    def forward(self, x):
        return torch.softmax(self.fc(self.ln(x)), dim=-1)


def test_layer_norm_softmax_training(own_daemon):
    d = own_daemon()
    _check_model(d, NormSoftmax(), lambda n: torch.randn(n, 24), train=True)


def test_guard_failure_recompiles_static(own_daemon):
    """Batch 1 is outside the guards (a symbol is >= 2): that call gets a
    static kernel of its own, as Dynamo specialises 0/1."""
    own_daemon()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    cm = torch.compile(m, backend="tccd", dynamic=True)
    with torch.no_grad():
        for n in (4, 9):
            x = torch.randn(n, 8)
            torch.testing.assert_close(cm(x), m(x), **F32)
        x = torch.randn(1, 8)
        torch.testing.assert_close(cm(x), m(x), **F32)
    assert tccd.stats()["dynamic_kernels"] == 1


def test_dynamic_off_compiles_per_size(own_daemon):
    d = own_daemon()
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
    cm = torch.compile(m, backend="tccd", dynamic=False)
    with torch.no_grad():
        for n in (4, 9):
            x = torch.randn(n, 8)
            torch.testing.assert_close(cm(x), m(x), **F32)
    assert tccd.stats()["dynamic_kernels"] == 0
    assert _compiles(d) >= 2


class Block(torch.nn.Module):
    """[batch, seq, 16]: two symbols; Linear on a 3-D input reshapes with
    symbolic sizes (those views run eagerly: the wire has no symbolic int
    arguments), the rest compiles to dynamic kernels."""

    def __init__(self):
        super().__init__()
        self.ln = torch.nn.LayerNorm(16)
        self.fc = torch.nn.Linear(16, 16)

    def forward(self, x):
        return torch.nn.functional.gelu(self.fc(self.ln(x))) + x


def test_batch_and_sequence_symbols(own_daemon):
    d = own_daemon()
    m = Block()
    ref = copy.deepcopy(m).double()
    cm = torch.compile(m, backend="tccd", dynamic=True)
    counts = []
    with torch.no_grad():
        for b, t in ((2, 5), (3, 7), (4, 3), (6, 11)):
            x = torch.randn(b, t, 16)
            torch.testing.assert_close(cm(x).double(), ref(x.double()), **F32)
            counts.append(_compiles(d))
    s = tccd.stats()
    assert s["dynamic_kernels"] >= 1, s
    assert counts[-1] == counts[0], counts      # no compile after the first shape
