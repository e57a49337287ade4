"""Real models through torch.compile(backend="tccd"): forward (training and
inference modes) and full training steps (loss.backward + optimizer step),
outputs, gradients, updated parameters and buffers matched against the same
model run eagerly, on fresh random inputs.

Tolerance: float32 rtol 1e-4 atol 1e-5 everywhere. Ops the daemon does not
compile run eagerly, so the compiled and eager programs differ only in the
pointwise kernels tccd generates (libm vs PyTorch's vectorised math, a few
ulp), which stays well inside that through two SGD steps at these sizes.
Where a training step's output is not within it of eager's, it must be
within it of the float64 model's, and a failure prints both programs'
distance from float64.
Fallback counts are printed; in the listed models no op may run eagerly
(views that leave a partition come back as aliases of the kernel's
buffers, partition.OutputAssembly).
"""
import copy
import importlib.util
import json
import os
import subprocess
import sys

import pytest
import torch

import tccd
from conftest import BUILD, CLIENT_LIB, SOURCE
from kinks import explain_by_relu_kinks
from models import MODELS

TOL = dict(rtol=1e-4, atol=1e-5)


def _compare_state(m, ref, what):
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p, q, **TOL, msg=lambda s: f"{what}: param {n}: {s}")
    for (n, b), (_, c) in zip(m.named_buffers(), ref.named_buffers()):
        if b.is_floating_point():
            torch.testing.assert_close(b, c, **TOL, msg=lambda s: f"{what}: buffer {n}: {s}")
        else:
            assert torch.equal(b, c), f"{what}: buffer {n}"


def _assert_output_as_float64s(ref, x, out, ref_out, what):
    """tccd's output, where it is not within TOL of eager's: it must be
    within TOL of the float64 model's (eager's float32 is a reference, not
    the truth), and the message gives both sides' distance from float64,
    so that a failure says which program was off."""
    ref64 = copy.deepcopy(ref).double()
    ref64.train(ref.training)
    with torch.no_grad():
        o64 = ref64(x.double())
    err = (out.double() - o64).abs().max().item()
    err_eager = (ref_out.double() - o64).abs().max().item()
    torch.testing.assert_close(
        out.double(), o64, **TOL,
        msg=lambda s: f"{what}: {s}\n(max |tccd - float64| {err:.3g}, max |eager - float64| {err_eager:.3g})")
    print(f"{what}: eager's float32 is off float64 by {err_eager:.3g}, tccd by {err:.3g}")


def _report(name):
    s = tccd.stats()
    print(f"{name}: {s['ops']} ops in {s['graphs']} graphs, {s['compiled_ops']} compiled in "
          f"{s['partitions']} partitions, {s['fallback_ops']} fall back")
    print(f"{name}: fallback ops {sorted(tccd.fallback_ops().items(), key=lambda kv: -kv[1])}")
    return s


@pytest.mark.parametrize("name", list(MODELS))
def test_training_steps_match_eager(daemon, name, fresh_state):
    make, data, loss_fn = MODELS[name]
    torch.manual_seed(fresh_state)
    m = make()
    ref = copy.deepcopy(m)
    m.train()
    ref.train()
    cm = torch.compile(m, backend="tccd")
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.05, momentum=0.9)
    for step in range(2):
        x, target = data()
        out = cm(x)
        ref_out = ref(x)
        if not torch.allclose(out, ref_out, **TOL):
            _assert_output_as_float64s(ref, x, out, ref_out, f"step {step} output")
        loss = loss_fn(out, target)
        ref_loss = loss_fn(ref_out, target)
        torch.testing.assert_close(loss, ref_loss, **TOL)
        loss.backward()
        ref_loss.backward()
        grads = [p.grad for p in m.parameters()]
        if not all(torch.allclose(g, q.grad, **TOL) for g, q in zip(grads, ref.parameters())):
            # Eager is not a safe reference where float32 rounding puts an
            # activation on the other side of a ReLU than float64 does
            # (kinks.py): then tccd's gradients must be float64's, the
            # model at eager's parameters, for some side at those kinks.
            ref64 = copy.deepcopy(ref).double()
            ref64.train()
            t64 = target.double() if target.is_floating_point() else target
            ok, why = explain_by_relu_kinks(ref64, lambda mm: loss_fn(mm(x.double()), t64),
                                            grads, TOL)
            if not ok:
                for (n, p), q in zip(m.named_parameters(), ref.parameters()):
                    torch.testing.assert_close(
                        p.grad, q.grad, **TOL,
                        msg=lambda s, n=n: f"step {step} grad {n} ({why}): {s}")
            # the two models now train on different gradients: nothing
            # further to compare step by step
            print(f"{name}: step {step}: gradients differ from eager's at a ReLU kink; tccd's "
                  f"are float64's with {why}")
            break
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
        _compare_state(m, ref, f"after step {step}")
    s = _report(name)
    kinds = sorted(g["kind"] for g in s["graphs_detail"])
    assert "forward" in kinds and "backward" in kinds, kinds
    assert s["compiled_ops"] > 0, "no op of the model was compiled"
    assert s["compiled_ops"] + s["fallback_ops"] == s["ops"]
    _assert_fallbacks(name)


# Ops that must not fall back in any model; and models where no op at all
# may run eagerly.
NEVER_EAGER = {"aten.convolution.default", "aten.convolution_backward.default",
               "aten.native_dropout.default", "aten.add.Tensor",
               "aten._scaled_dot_product_flash_attention_for_cpu.default",
               "aten._scaled_dot_product_flash_attention_for_cpu_backward.default"}
ALL_COMPILED = {"resnet", "mlp", "transformer", "gpt"}


def _assert_fallbacks(name):
    fb = tccd.fallback_ops()
    assert not NEVER_EAGER & set(fb), f"{name}: fell back: {sorted(NEVER_EAGER & set(fb))}"
    if name in ALL_COMPILED:
        assert not fb, f"{name}: ops ran eagerly: {fb}"


@pytest.mark.parametrize("name", list(MODELS))
def test_inference_matches_eager(daemon, name, fresh_state):
    make, data, _ = MODELS[name]
    torch.manual_seed(fresh_state)
    m = make().eval()
    cm = torch.compile(m, backend="tccd")
    with torch.no_grad():
        for _ in range(2):
            x, _t = data()
            torch.testing.assert_close(cm(x), m(x), **TOL)
    s = _report(name)
    assert all(g["kind"] == "inference" for g in s["graphs_detail"])
    if name in ("resnet", "mlp"):
        assert s["fallback_ops"] == 0, tccd.fallback_ops()
    elif name != "transformer":   # inference runs nn's fused fast path, one eager op
        _assert_fallbacks(name)


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed in the test venv")
def test_bert_random_init(daemon, fresh_state):
    """BERT from transformers with a random-initialised small config (no
    downloads): forward and one training step match eager."""
    from transformers import BertConfig, BertModel

    cfg = BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, max_position_embeddings=64,
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    torch.manual_seed(fresh_state)
    m = BertModel(cfg)
    ref = copy.deepcopy(m)
    cm = torch.compile(m, backend="tccd")
    ids = torch.randint(0, 256, (2, 24))
    mask = torch.ones(2, 24, dtype=torch.long)
    mask[1, 20:] = 0
    out = cm(input_ids=ids, attention_mask=mask).last_hidden_state
    ref_out = ref(input_ids=ids, attention_mask=mask).last_hidden_state
    torch.testing.assert_close(out, ref_out, **TOL)
    out.square().mean().backward()
    ref_out.square().mean().backward()
    for (n, p), q in zip(m.named_parameters(), ref.parameters()):
        # the unused pooler: eager leaves grad None, the compiled backward
        # (AOTAutograd) gives zeros
        want = q.grad if q.grad is not None else torch.zeros_like(q)
        got = p.grad if p.grad is not None else torch.zeros_like(p)
        torch.testing.assert_close(got, want, **TOL, msg=lambda s: f"grad {n}: {s}")
    s = _report("bert")
    # embeddings, their backward and the attention mask's advanced
    # indexing are compiled too: nothing runs eagerly
    assert s["fallback_ops"] == 0, tccd.fallback_ops()


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                    reason="transformers is not installed in the test venv")
def test_gpt2_decode_with_a_static_cache(daemon, fresh_state):
    """GPT-2 from transformers (random-initialised small config) decoding
    token by token in a StaticCache, the serving loop: each step's logits
    and the cache match eager's, the cache's rows are written in place
    (two writes per layer, compiled into the step's one partition; nothing
    falls back) and the cache tensors stay the same storage."""
    from transformers import GPT2Config, GPT2LMHeadModel, StaticCache

    cfg = GPT2Config(vocab_size=256, n_embd=64, n_layer=2, n_head=4, n_positions=64,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    torch.manual_seed(fresh_state)
    lm = GPT2LMHeadModel(cfg).eval()
    ref = copy.deepcopy(lm)
    caches = [StaticCache(config=cfg, max_cache_len=24) for _ in range(2)]
    prompt = torch.randint(0, 256, (1, 6))
    with torch.no_grad():
        for m, c in zip((lm, ref), caches):
            m(input_ids=prompt, past_key_values=c, use_cache=True, cache_position=torch.arange(6))

    def step(m, c, tok, pos):
        return m(input_ids=tok, past_key_values=c, position_ids=pos[None], cache_position=pos,
                 use_cache=True).logits

    cstep = torch.compile(step, backend="tccd")
    keys = [layer.keys for layer in caches[0].layers]
    ptrs = [k.data_ptr() for k in keys]
    with torch.no_grad():
        for p in range(6, 11):
            tok, pos = torch.randint(0, 256, (1, 1)), torch.tensor([p])
            torch.testing.assert_close(cstep(lm, caches[0], tok, pos), step(ref, caches[1], tok, pos), **TOL)
            for a, b in zip(caches[0].layers, caches[1].layers):
                torch.testing.assert_close(a.keys, b.keys, **TOL)
                torch.testing.assert_close(a.values, b.values, **TOL)
    assert [layer.keys.data_ptr() for layer in caches[0].layers] == ptrs
    details = tccd.stats()["graphs_detail"]
    assert sum(g.get("writes_in_place", 0) for g in details) == 2 * cfg.n_layer, details
    # written by the kernels, in the one partition that reads the cache
    assert sum(g.get("eager_writes_in_place", 0) for g in details) == 0, details
    assert [g["partitions"] for g in details if g["ops"]] == [1], details
    assert tccd.stats()["fallback_ops"] == 0, tccd.fallback_ops()


class _DropNet(torch.nn.Module):
    """fc -> relu -> dropout -> fc, returning the dropout's output too (its
    zeros are the mask wherever relu let a value through)."""

    def __init__(self, p):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 256)
        self.fc2 = torch.nn.Linear(256, 8)
        self.drop = torch.nn.Dropout(p)

    def forward(self, x):
        d = self.drop(torch.relu(self.fc1(x)))
        return self.fc2(d), d


@pytest.mark.parametrize("p", [0.2, 0.5])
def test_dropout_training(daemon, fresh_state, p):
    """Dropout in train mode is compiled (a seed tensor per call): the drop
    rate is p within 6 standard deviations, output and gradients match an
    eager model that applies the same mask, torch.manual_seed makes runs
    reproducible, and consecutive calls draw different masks."""
    torch.manual_seed(fresh_state)
    m = _DropNet(p).train()
    ref = copy.deepcopy(m)
    cm = torch.compile(m, backend="tccd")
    x = torch.randn(64, 32)
    out, d = cm(x)
    h = torch.relu(ref.fc1(x))
    live = h > 0
    mask = (d != 0)
    assert not (mask & ~live).any(), "dropout kept a value relu zeroed"
    n = int(live.sum())
    rate = 1 - (mask & live).sum().item() / n
    assert abs(rate - p) <= 6 * (p * (1 - p) / n) ** 0.5, (rate, p, n)
    ref_d = h * mask * (1.0 / (1.0 - p))
    ref_out = ref.fc2(ref_d)
    torch.testing.assert_close(d, ref_d, **TOL)
    torch.testing.assert_close(out, ref_out, **TOL)
    (out.square().mean() + d.mean()).backward()
    (ref_out.square().mean() + ref_d.mean()).backward()
    for (nm, a), b in zip(m.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, **TOL, msg=lambda s: f"grad {nm}: {s}")
    # reproducible under torch.manual_seed; fresh masks otherwise
    with torch.no_grad():
        torch.manual_seed(fresh_state + 1)
        d1 = cm(x)[1]
        torch.manual_seed(fresh_state + 1)
        d2 = cm(x)[1]
        d3 = cm(x)[1]
    assert torch.equal(d1, d2), "same torch seed, different masks"
    assert not torch.equal(d2, d3), "two calls drew the same mask"
    _report(f"dropout p={p}")
    fb = tccd.fallback_ops()
    assert "aten.native_dropout.default" not in fb, fb


def test_relu_kink_reference_accepts_flips_only(fresh_state):
    """kinks.py, which the training test trusts when eager's gradients are
    off: gradients with one ReLU activation at 5e-7 taken on the other side
    are accepted (and the flip named); the same gradients with one element
    moved by 1e-3, or float64's own with an element moved, are not."""
    torch.manual_seed(fresh_state)
    m = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(),
                            torch.nn.Linear(3, 2)).double()
    x = torch.randn(5, 4, dtype=torch.float64)
    with torch.no_grad():   # put activation (0, 0) at +5e-7
        pre = m[0](x)
        m[0].bias[0] -= pre[0, 0] - 5e-7
    run_loss = lambda mm: mm(x).square().sum()   # noqa: E731

    def grads(flip):
        mm = copy.deepcopy(m)
        h = mm[0](x)
        mask = (h > 0).double()
        if flip:
            mask[0, 0] = 1 - mask[0, 0]
        mm[2](h * mask).square().sum().backward()
        return [p.grad.float() for p in mm.parameters()]

    ok, why = explain_by_relu_kinks(copy.deepcopy(m), run_loss, grads(False), TOL)
    assert ok and "no flip" in why, why
    flipped = grads(True)
    assert not all(torch.allclose(a, b, **TOL) for a, b in zip(flipped, grads(False)))
    ok, why = explain_by_relu_kinks(copy.deepcopy(m), run_loss, flipped, TOL)
    assert ok and "relu call 0 element 0" in why, why
    for g in (flipped, grads(False)):
        bad = [t.clone() for t in g]
        bad[2].view(-1)[1] += 1e-3
        ok, why = explain_by_relu_kinks(copy.deepcopy(m), run_loss, bad, TOL)
        assert not ok, why


def _rss_mb():
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("name", ["gpt", "resnet"])
@pytest.mark.parametrize("from_recipe", [False, True])
def test_rss_stays_flat_over_training_steps(daemon, name, from_recipe, tmp_path, monkeypatch):
    """Kernels, workspaces, signatures and output views are reused, not
    accumulated: after warm-up, 2 x 200 more training steps leave the
    process's resident size where it was (a tensor of the step leaked per
    step would add megabytes). from_recipe: the graphs are set up from a
    saved recipe (a second compile against the same AOTAutograd cache)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "aot"))
    make, data, loss_fn = MODELS[name]
    for attempt in range(2 if from_recipe else 1):
        torch._dynamo.reset()
        hits = tccd.stats()["aot_recipe_hits"]
        m = make()
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        cm = torch.compile(m, backend="tccd")
        batches = [data() for _ in range(4)]

        def step(i):
            x, t = batches[i % 4]
            loss_fn(cm(x), t).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        for i in range(30):
            step(i)
    assert (tccd.stats()["aot_recipe_hits"] > hits) == from_recipe
    sizes = [_rss_mb()]
    for _ in range(2):
        for i in range(200):
            step(i)
        sizes.append(_rss_mb())
    print(f"{name} from_recipe={from_recipe}: "
          f"RSS {sizes[0]:.1f} -> {sizes[1]:.1f} -> {sizes[2]:.1f} MB")
    assert sizes[2] - sizes[1] < 2.0 and sizes[1] - sizes[0] < 8.0, sizes
    torch._dynamo.reset()


def test_gpu_models_script_runs_on_the_cpu(tmp_path):
    """scripts/gpu-models, which the GPU machine runs from the bundle, on
    the CPU with 2-layer models (--device cpu --small): a GPT-2 decode step
    with a StaticCache (its update is an index_put) and a ResNet training
    step (its loss's backward has a scatter) compile whole, match eager
    (or, where eager is off, the float64 model), and the JSON holds every
    backend's figures."""
    out = tmp_path / "gm.json"
    p = subprocess.run([sys.executable, os.path.join(SOURCE, "scripts", "gpu-models"), "--device", "cpu",
                        "--small", "--cases", "gpt2-decode,resnet50-train", "--dtypes", "fp32",
                        "--backends", "eager,tccd,tccd-ro", "--no-warmup", "--steps", "3",
                        "--build-dir", BUILD, "--json", str(out)],
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, TCCD_CLIENT_LIB=CLIENT_LIB))
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    assert doc["skipped"] == []
    for case in ("gpt2-decode/fp32", "resnet50-train/fp32"):
        m = doc["results"][case]["measure"]
        for b in ("eager", "tccd", "tccd-ro"):
            assert "error" not in m[b], (case, b, m[b])
            assert m[b]["ms"] > 0 and m[b]["first_s"] > 0, (case, b, m[b])
        for b in ("tccd", "tccd-ro"):
            assert m[b]["fallback_ops"] == 0, (case, b, m[b].get("fallback_detail"))
            # eager's float32 is a reference, not the truth: where tccd is
            # off eager's, it must be within the bound of the float64
            # model's (ResNet's conv gradients on an AMD EPYC: eager 5e-2
            # off float64, tccd 6e-6)
            err, err64 = m[b]["max_rel_err"], m[b].get("max_rel_err_f64")
            assert err < 1e-4 or (err64 is not None and err64 < 1e-4), \
                (case, b, "vs eager", err, "vs float64", err64,
                 "eager vs float64", m["eager"].get("max_rel_err_f64"))
    assert "max_rel_err_f64" in doc["results"]["resnet50-train/fp32"]["measure"]["eager"]
    assert "gpt2-decode" in p.stdout and "summary:" in p.stdout
