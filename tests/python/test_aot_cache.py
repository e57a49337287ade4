"""AOTAutograd's result cached on the node (tccd.aot_cache): a graph
compiled again after torch._dynamo.reset() -- what a new process does --
is loaded instead of traced, runs right forward and backward, and never
meets another graph's entry (constants by value, options, Inductor's).
Every test has its own TORCHINDUCTOR_CACHE_DIR."""
import os
import time

import pytest
import torch

import tccd

from models import CachedAttention

TOL = dict(rtol=1e-4, atol=1e-5)


@pytest.fixture(autouse=True)
def aot_dir(tmp_path, monkeypatch):
    d = tmp_path / "aot"
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(d))
    torch._dynamo.reset()
    seed = time.time_ns() % (2**31)
    print("seed", seed)
    torch.manual_seed(seed)
    yield d
    torch._dynamo.reset()
    from tccd import partition as P

    P.forget_op_tables()     # what a test's daemon refused is not the next test's


def _entries(d):
    p = d / "aotautograd"
    return sorted(os.listdir(p)) if p.exists() else []


def _hits():
    return tccd.stats()["aot_cache_hits"]


def _train_step(fn, backend, *shapes):
    """fn's output and input grads on fresh inputs, compiled and eager."""
    xs = [torch.randn(*s, requires_grad=True) for s in shapes]
    ref = [x.detach().clone().requires_grad_() for x in xs]
    out = torch.compile(fn, backend=backend)(*xs)
    want = fn(*ref)
    torch.testing.assert_close(out, want, **TOL)
    g = torch.randn_like(want)
    out.backward(g)
    want.backward(g)
    for x, r in zip(xs, ref):
        torch.testing.assert_close(x.grad, r.grad, **TOL)


def test_recompile_loads_forward_and_backward(daemon, aot_dir):
    def f(x, w):
        return torch.tanh(x @ w) * torch.sigmoid(x).sum(1, keepdim=True)

    before = _hits()
    _train_step(f, "tccd", (8, 16), (16, 4))
    assert _hits() == before, "a cold cache served an entry"
    keys = _entries(aot_dir)
    assert len(keys) == 1 and keys[0].startswith("tccd")

    torch._dynamo.reset()                    # a new process would start here
    _train_step(f, "tccd", (8, 16), (16, 4))
    assert _hits() == before + 2             # the forward and the backward graph
    assert _entries(aot_dir) == keys


def test_inference_graph_is_cached(daemon):
    def f(x, y):
        return torch.sin(x) + torch.cos(y) * 2

    x, y = torch.randn(6, 7), torch.randn(6, 7)
    torch.testing.assert_close(torch.compile(f, backend="tccd")(x, y), f(x, y), **TOL)
    before = _hits()
    torch._dynamo.reset()
    x, y = torch.randn(6, 7), torch.randn(6, 7)
    torch.testing.assert_close(torch.compile(f, backend="tccd")(x, y), f(x, y), **TOL)
    assert _hits() == before + 1


def _scaled_by(values):
    def f(x):
        return x * torch.tensor(values) + 1
    return f


def test_constants_are_keyed_by_value(daemon, aot_dir):
    """Two graphs that differ only in a constant tensor's values get two
    entries: the second is not served the first's constant."""
    x = torch.randn(4, 3)
    f1, f2 = _scaled_by([1.0, 2.0, 3.0]), _scaled_by([-5.0, 0.5, 7.0])
    torch.testing.assert_close(torch.compile(f1, backend="tccd")(x), f1(x), **TOL)
    torch._dynamo.reset()
    before = _hits()
    torch.testing.assert_close(torch.compile(f2, backend="tccd")(x), f2(x), **TOL)
    assert _hits() == before
    assert len(_entries(aot_dir)) == 2


def test_options_are_part_of_the_key(daemon, aot_dir):
    def f(x):
        return torch.relu(x) * 3 - x

    x = torch.randn(5, 5)
    torch.compile(f, backend="tccd")(x)
    torch._dynamo.reset()
    before = _hits()
    out = torch.compile(f, backend=tccd.backend(mode="max-autotune"))(x)
    torch.testing.assert_close(out, f(x), **TOL)
    assert _hits() == before and len(_entries(aot_dir)) == 2


def test_off_traces_every_time(daemon, aot_dir):
    def f(x):
        return torch.exp(-x * x)

    for _ in range(2):
        torch._dynamo.reset()
        x = torch.randn(9)
        before = _hits()
        out = torch.compile(f, backend=tccd.backend(aot_cache=False))(x)
        torch.testing.assert_close(out, f(x), **TOL)
        assert _hits() == before
    assert _entries(aot_dir) == []


def test_dynamic_shapes_entry_serves_other_sizes(daemon):
    def f(x):
        return torch.softmax(x * 2, dim=-1) + x.mean()

    be = tccd.backend(dynamic=True)
    for n in (8, 16):
        x = torch.randn(n, 32)
        torch.testing.assert_close(torch.compile(f, backend=be, dynamic=True)(x), f(x), **TOL)
    torch._dynamo.reset()
    before = _hits()
    cf = torch.compile(f, backend=be, dynamic=True)
    for n in (8, 24, 40):
        x = torch.randn(n, 32)
        torch.testing.assert_close(cf(x), f(x), **TOL)
    assert _hits() > before


def _key(gm, example_inputs, **aot_options):
    from torch._functorch._aot_autograd.schemas import AOTConfig

    from tccd import aot_cache
    from tccd.config import Config

    cfg = Config.make()
    aot_config = AOTConfig(fw_compiler=None, bw_compiler=None, inference_compiler=None,
                           partition_fn=None, decompositions={}, num_params_buffers=0,
                           aot_id=0, keep_inference_input_mutations=False, **aot_options)
    with aot_cache.caching(cfg, aot_cache.key_tag(cfg, False, False, ())):
        return aot_cache.cache_key(gm, example_inputs, aot_config)[0]


def test_key_hashes_constant_values_not_parameter_values():
    """A get_attr tensor constant (AOTAutograd bakes it into the graph) is
    keyed by value; a parameter (lifted to an input) by metadata only."""
    from torch._subclasses import FakeTensorMode

    def graph_with(attr):
        root = torch.nn.Module()
        root.c = attr
        g = torch.fx.Graph()
        x = g.placeholder("x")
        g.output((g.call_function(torch.ops.aten.mul.Tensor, (x, g.get_attr("c"))),))
        return torch.fx.GraphModule(root, g)

    with FakeTensorMode():
        inputs = [torch.empty(3)]          # the fake inputs Dynamo hands over
    a = torch.randn(3)
    same = _key(graph_with(a.clone()), inputs)
    assert _key(graph_with(a.clone()), inputs) == same
    assert _key(graph_with(a + 1), inputs) != same
    p = torch.nn.Parameter(torch.randn(3))
    q = torch.nn.Parameter(torch.randn(3))
    assert _key(graph_with(p), inputs) == _key(graph_with(q), inputs)
    assert _key(graph_with(p), inputs) != _key(graph_with(p.detach().double()), inputs)


def test_key_reads_input_sources_by_path():
    """Dynamo hands AOTAutograd each input's Source (the path its guards
    read it through, aot_autograd_arg_pos_to_source): the key covers the
    path (class and name), so equal paths built anew key the same and
    another path keys apart."""
    from torch._dynamo.source import AttrSource, LocalSource
    from torch._subclasses import FakeTensorMode

    g = torch.fx.Graph()
    x = g.placeholder("x")
    w = g.placeholder("w")
    g.output((g.call_function(torch.ops.aten.mul.Tensor, (x, w)),))
    gm = torch.fx.GraphModule(torch.nn.Module(), g)

    def sources(*path):
        src = LocalSource("self")
        for attr in path:
            src = AttrSource(src, attr)
        return [LocalSource("x"), src]

    with FakeTensorMode():
        inputs = [torch.empty(3), torch.empty(3)]
    same = _key(gm, inputs, aot_autograd_arg_pos_to_source=sources("layer", "weight"))
    assert _key(gm, inputs, aot_autograd_arg_pos_to_source=sources("layer", "weight")) == same
    assert _key(gm, inputs, aot_autograd_arg_pos_to_source=sources("layer", "bias")) != same
    assert _key(gm, inputs, aot_autograd_arg_pos_to_source=sources("other", "weight")) != same
    assert _key(gm, inputs) != same


def test_loaded_graph_partitions_again_when_the_daemon_refuses_a_node(daemon, monkeypatch,
                                                                      aot_dir):
    """A loaded graph whose first partitioning meets a node the daemon
    refuses partitions again from a fresh copy of the loaded graph. (The
    recipe the first round saves is removed: the second round partitions.)"""
    from tccd import partition as P

    ops = {"aten.sin.default": "pointwise", "aten.mul.Tensor": "pointwise",
           "aten.mul.Scalar": "pointwise", "aten.exp.default": "pointwise",
           "aten.sub.Tensor": "pointwise", "aten.sub.Scalar": "pointwise",
           "aten.cumprod.default": "reduction"}     # claims cumprod, which the daemon refuses
    table = P.OpTable("rpc", ops, (torch.float32, torch.float64), "test")
    monkeypatch.setattr(P, "op_table", lambda client, cfg, device=None: table)

    def f(x):
        return torch.exp(torch.cumprod(torch.sin(x) * 2, 0)) - 1

    for round in range(2):
        torch._dynamo.reset()
        P.forget_op_tables()                   # nothing learned from the round before
        for path in _recipe_files(aot_dir):
            path.unlink()
        before = _hits()
        x = torch.randn(7, 3)
        torch.testing.assert_close(torch.compile(f, backend="tccd")(x), f(x), **TOL)
        assert _hits() == before + round
        assert tccd.fallback_ops().get("aten.cumprod.default", 0) == round + 1


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_damaged_entry_is_traced_again(daemon, aot_dir, damage):
    """An entry that does not unpickle (a torn write, a disk error) costs
    a trace, not a crash or a wrong answer."""
    def f(x, w):
        return torch.relu(x @ w) + x.sum()

    _train_step(f, "tccd", (6, 5), (5, 5))
    files = [os.path.join(r, n) for r, _, ns in os.walk(aot_dir / "aotautograd") for n in ns]
    assert files
    for path in files:
        data = open(path, "rb").read()
        with open(path, "wb") as fh:
            fh.write(os.urandom(len(data)) if damage == "garbage" else data[:len(data) // 2])
    torch._dynamo.reset()
    before = _hits()
    _train_step(f, "tccd", (6, 5), (5, 5))
    assert _hits() == before


# ------------------------------------------------------------------ saved recipes

def _recipe_hits():
    return tccd.stats()["aot_recipe_hits"]


def _recipe_files(d):
    p = d / "tccd" / "recipes"
    return sorted(p.iterdir()) if p.exists() else []


def _gelu_view(x, w):
    # forward and backward partitions; an output that is a view (transpose)
    return torch.nn.functional.gelu(x @ w).t() * x.mean()


def _count_graph_loads(monkeypatch):
    """A list that grows by one each time a graph is unpickled."""
    from torch.fx._graph_pickler import GraphPickler

    loads, real = [], GraphPickler.loads

    def counting(*a, **kw):
        loads.append(1)
        return real(*a, **kw)
    monkeypatch.setattr(GraphPickler, "loads", staticmethod(counting))
    return loads


def _rewrite_recipes(d, change):
    import pickle

    for path in _recipe_files(d):
        saved = pickle.loads(path.read_bytes())
        change(saved)
        path.write_bytes(pickle.dumps(saved))


def test_reload_runs_from_the_saved_recipe(daemon, aot_dir, monkeypatch):
    """An entry's first setup saves each graph's partitioning; a reload runs
    from it -- no graph unpickled, nothing partitioned -- and gets eager's
    values and gradients."""
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert [p.name.rsplit("-", 1)[1] for p in _recipe_files(aot_dir)] == \
        ["backward.recipe", "forward.recipe"]
    loads = _count_graph_loads(monkeypatch)
    torch._dynamo.reset()
    hits, restored = _hits(), _recipe_hits()
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert _hits() == hits + 2 and _recipe_hits() == restored + 2
    assert loads == []
    stats = tccd.stats()
    details = [g for g in stats["graphs_detail"] if g.get("from_recipe")]
    assert len(details) >= 2 and all(g["fallback_ops"] == 0 for g in details)
    # the deprecated names (until 0.2) say the same
    assert stats["aot_plan_hits"] == stats["aot_recipe_hits"]
    assert all(g["planned"] for g in details)


def test_cache_written_in_place_from_the_recipe(daemon, aot_dir):
    """A decode step whose KV cache is written in place (an eager
    index_put_ between partitions: partition.write_in_place) saves its
    recipe, and a reload runs from it: the same writes, outputs and caches
    equal to eager's step after step."""
    torch.manual_seed(3)
    ref = CachedAttention()
    mod = CachedAttention()
    mod.load_state_dict(ref.state_dict())

    def steps(positions):
        opt = torch.compile(mod, backend="tccd")
        with torch.no_grad():
            for p in positions:
                x, pos = torch.randn(1, 1, 16), torch.tensor([p])
                torch.testing.assert_close(opt(x, pos), ref(x, pos), rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(mod.k, ref.k, rtol=1e-4, atol=1e-5)
                torch.testing.assert_close(mod.v, ref.v, rtol=1e-4, atol=1e-5)

    steps([0, 1])
    assert [p.name.rsplit("-", 1)[1] for p in _recipe_files(aot_dir)] == ["inference.recipe"]
    torch._dynamo.reset()
    restored = _recipe_hits()
    steps([2, 3, 7])
    assert _recipe_hits() == restored + 1
    (g,) = [g for g in tccd.stats()["graphs_detail"] if g.get("from_recipe")]
    assert g["writes_in_place"] == 2 and g["fallback_ops"] == 0, g


def test_inputs_the_recipe_never_saw_partition_again(daemon, aot_dir, monkeypatch):
    """A restored partition called with a layout it has no kernel for
    (here: a recipe whose signatures were altered) runs the graph from the
    loaded entry instead, right, and saves a recipe that fits."""
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))

    def shift_offsets(saved):
        for sp in saved["partitions"]:
            sp["kernels"] = [(tuple((k[0], k[1], k[2], k[3] + 1, k[4]) for k in key), *rest)
                             for key, *rest in sp["kernels"]]
    _rewrite_recipes(aot_dir, shift_offsets)
    loads = _count_graph_loads(monkeypatch)
    torch._dynamo.reset()
    graphs = tccd.stats()["graphs"]
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert len(loads) == 2                  # forward and backward, loaded after all
    assert tccd.stats()["graphs"] == graphs + 2     # each counted once
    torch._dynamo.reset()
    restored = _recipe_hits()
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert _recipe_hits() == restored + 2 and len(loads) == 2


@pytest.mark.parametrize("damage", ["garbage", "refused", "another tccd"])
def test_unusable_recipe_partitions_again(daemon, aot_dir, monkeypatch, damage):
    """A recipe that does not unpickle, whose requests the daemon rejects, or
    that another version of the package wrote costs a partitioning, not a
    crash or a wrong answer."""
    from tccd._proto import tcc_pb2 as pb

    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    if damage == "garbage":
        for path in _recipe_files(aot_dir):
            path.write_bytes(os.urandom(path.stat().st_size))
    elif damage == "another tccd":
        _rewrite_recipes(aot_dir, lambda saved: saved.update(package="0" * 64))
    else:
        def bad_output(saved):
            for sp in saved["partitions"]:
                for i, (key, request, *rest) in enumerate(sp["kernels"]):
                    req = pb.CompileRequest.FromString(request)
                    req.graph.outputs.append("no_such_value")
                    sp["kernels"][i] = (key, req.SerializeToString(), *rest)
        _rewrite_recipes(aot_dir, bad_output)
    loads = _count_graph_loads(monkeypatch)
    torch._dynamo.reset()
    restored = _recipe_hits()
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert _recipe_hits() == restored and len(loads) == 2


def test_recipe_keeps_the_ops_that_run_eagerly(daemon, aot_dir, monkeypatch):
    """A graph with ops the daemon does not compile (cumprod, sort) gets
    a recipe too: the recipe calls them eagerly where the graph did, and
    counts them as fallback as the first setup did."""
    def f(x, y):
        a = torch.sin(x) * 2 + y
        b = torch.sort(torch.cumprod(a, 0), dim=1).values
        return torch.exp(b) - torch.cos(a)

    tccd.reset_stats()
    _train_step(f, "tccd", (6, 5), (6, 5))
    first = tccd.stats()
    assert first["fallback_ops"] > 0 and len(_recipe_files(aot_dir)) == 2
    loads = _count_graph_loads(monkeypatch)
    torch._dynamo.reset()
    tccd.reset_stats()
    _train_step(f, "tccd", (6, 5), (6, 5))
    again = tccd.stats()
    assert again["aot_recipe_hits"] == 2 and loads == []
    for k in ("graphs", "ops", "compiled_ops", "fallback_ops", "partitions", "kernels"):
        assert again[k] == first[k], k
    assert tccd.fallback_ops().get("aten.cumprod.default", 0) >= 1


@pytest.mark.parametrize("fallback", ["error", "eager"])
def test_recipe_when_the_daemon_is_down(daemon, aot_dir, monkeypatch, tmp_path, fallback):
    """A warm entry with a recipe and no daemon: the clear TccdUnavailable
    of any setup (once, not again from partitioning), and the recipe serves
    when the daemon is back; with fallback="eager", the warning and
    eager's answer."""
    import warnings

    from conftest import Daemon, free_port

    backend = tccd.backend(fallback="eager") if fallback == "eager" else "tccd"
    _train_step(_gelu_view, backend, (8, 16), (16, 4))     # entry and recipes
    assert len(_recipe_files(aot_dir)) == 2
    port = free_port()
    monkeypatch.setenv("TCCD_ADDR", f"127.0.0.1:{port}")
    monkeypatch.setenv("TCCD_CONNECT_TIMEOUT_MS", "500")
    torch._dynamo.reset()
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(16, 4, requires_grad=True)
    want = _gelu_view(x.detach().double(), w.detach().double())
    opt = torch.compile(_gelu_view, backend=backend)
    if fallback == "eager":
        with pytest.warns(tccd.TccdFallbackWarning, match="UNAVAILABLE.*runs eagerly"):
            out = opt(x, w)
        torch.testing.assert_close(out.double(), want, **TOL)
        return
    from tccd import dynamo as D

    connects, real_client_for = [], D.client_for

    def counting_client_for(cfg):
        connects.append(cfg.addr)
        return real_client_for(cfg)
    monkeypatch.setattr(D, "client_for", counting_client_for)
    with pytest.raises(tccd.TccdUnavailable):
        opt(x, w)
    assert len(connects) == 1                # one connect timeout, not a second one
    d = Daemon(tmp_path / "back", port=port).start()
    try:
        restored = _recipe_hits()
        with warnings.catch_warnings():
            warnings.simplefilter("error", tccd.TccdFallbackWarning)
            out = opt(x, w)
            torch.testing.assert_close(out.double(), want, **TOL)
            out.sum().backward()
        assert _recipe_hits() == restored + 2
    finally:
        assert d.stop() == 0


def test_dynamic_shapes_recipe(daemon, aot_dir, monkeypatch):
    """A dynamic-shape graph's recipe holds its dynamic kernels (any size
    their guards admit) and the per-size kernels of partitions the daemon
    would not make dynamic: a reload at a size the recipe has serves from
    it; at a size only a dynamic kernel admits, the graphs whose every
    partition has one still do, and the others partition again."""
    be = tccd.backend(dynamic=True)

    def step(n):
        x = torch.randn(n, 16, requires_grad=True)
        w = torch.randn(16, 4, requires_grad=True)
        xr, wr = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
        out = torch.compile(_gelu_view, backend=be, dynamic=True)(x, w)
        want = _gelu_view(xr, wr)
        torch.testing.assert_close(out.double(), want, **TOL)
        out.sum().backward()
        want.sum().backward()
        torch.testing.assert_close(x.grad.double(), xr.grad, **TOL)
        torch.testing.assert_close(w.grad.double(), wr.grad, **TOL)

    step(8)
    assert len(_recipe_files(aot_dir)) == 2
    loads = _count_graph_loads(monkeypatch)
    torch._dynamo.reset()
    restored, dyn = _recipe_hits(), tccd.stats()["dynamic_kernels"]
    step(8)
    assert _recipe_hits() == restored + 2 and loads == []
    assert tccd.stats()["dynamic_kernels"] > dyn         # the recipe fetched dynamic kernels
    step(20)                                             # the same compiled graphs, another size
    # the forward's one partition is dynamic: it serves 20 from the recipe;
    # the backward has a partition the daemon compiles per size (its
    # tccd_1 today): that graph alone loads and partitions again
    assert len(loads) <= 1


def test_light_entry_derives_values_when_it_has_no_recipe(daemon, aot_dir, monkeypatch):
    """A CPU graph of static shapes is stored without its nodes' traced
    values (pickling them was most of a cold first call's own cost); a
    process that must unpickle it -- no recipe -- derives them by fake
    propagation, for the forward and the backward graph, and runs right."""
    from tccd import aot_cache

    derived = []
    real = aot_cache._derive_values
    monkeypatch.setattr(aot_cache, "_derive_values", lambda *a: derived.append(1) or real(*a))
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert derived == []
    for path in _recipe_files(aot_dir):
        path.unlink()
    torch._dynamo.reset()
    hits = _hits()
    loads = _count_graph_loads(monkeypatch)
    _train_step(_gelu_view, "tccd", (8, 16), (16, 4))
    assert _hits() == hits + 2 and len(loads) >= 2
    assert len(derived) == len(loads)
