"""Partitioning: ops the daemon does not compile run eagerly, the answer
stays right, and the count of those ops is reported (stats, fallback_ops,
one INFO line per graph)."""
import operator

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import tccd
from tccd import partition as P

F64 = dict(rtol=1e-5, atol=1e-6)


def test_unsupported_ops_fall_back_with_right_answer(daemon):
    def f(x, y):
        a = torch.sin(x) * 2 + y
        b = torch.cumsum(a, 0)                 # not compiled by tccd (today)
        c = torch.sort(b, dim=1).values        # nor this
        return torch.exp(c) - torch.cos(a)

    opt = torch.compile(f, backend="tccd")
    for _ in range(2):
        x, y = torch.randn(6, 5), torch.randn(6, 5)
        torch.testing.assert_close(opt(x, y).double(), f(x.double(), y.double()), **F64)
    s = tccd.stats()
    fb = tccd.fallback_ops()
    print(s["graphs_detail"], fb)
    assert s["fallback_ops"] > 0 and s["compiled_ops"] > 0
    assert fb.get("aten.cumsum.default") == 1 and fb.get("aten.sort.default") == 1
    assert s["compiled_ops"] + s["fallback_ops"] == s["ops"]
    rec = s["graphs_detail"][0]
    assert rec["fallback_ops"] == sum(rec["fallback"].values())
    assert any("aten.cumsum.default" in ops for ops in rec["reasons"].values())


def test_whole_graph_eager_for_other_devices(daemon, caplog):
    """Tensors on a device tccd has no target for (CUDA today; "meta" here,
    which this CPU-only torch has) run the whole graph eagerly, logged."""
    import logging

    caplog.set_level(logging.INFO, logger="tccd")

    def f(x):
        return torch.sin(x) + 1

    out = torch.compile(f, backend="tccd")(torch.empty(4, 4, device="meta"))
    assert out.device.type == "meta" and out.shape == (4, 4)
    s = tccd.stats()
    assert s["eager_graphs"] == 1 and s["compiled_ops"] == 0
    assert "meta tensors" in s["graphs_detail"][0]["reason"]
    assert any("run eagerly" in r.getMessage() for r in caplog.records if r.name == "tccd")


@pytest.fixture
def rpc_table(monkeypatch):
    """Pretends the daemon answered Compiler.Ops with `ops` (target -> kind)."""
    def install(ops, dtypes=(torch.float32, torch.float64)):
        table = P.OpTable("rpc", ops, dtypes, "test")
        monkeypatch.setattr(P, "op_table", lambda client, cfg, device=None: table)
        return table
    return install


POINTWISE = {t: "pointwise" for t in (
    "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Tensor", "aten.div.Tensor",
    "aten.add.Scalar", "aten.sub.Scalar", "aten.mul.Scalar", "aten.div.Scalar",
    "aten.neg.default", "aten.abs.default", "aten.exp.default", "aten.log.default",
    "aten.sqrt.default", "aten.sin.default", "aten.cos.default", "aten.tanh.default",
    "aten.sigmoid.default", "aten.relu.default")}


def test_op_table_from_rpc_needs_no_trial_compiles(daemon, rpc_table):
    rpc_table(POINTWISE)

    def f(x, y):
        return torch.sin(x) + torch.cos(y) * torch.tanh(x)

    x, y = torch.randn(8, 8), torch.randn(8, 8)
    torch.testing.assert_close(torch.compile(f, backend="tccd")(x, y).double(),
                               f(x.double(), y.double()), **F64)
    s = tccd.stats()
    assert s["trial_compiles"] == 0 and s["fallback_ops"] == 0 and s["compiled_ops"] == 5


def test_table_dtypes_limit_what_is_sent(daemon, rpc_table):
    rpc_table(POINTWISE, dtypes=(torch.float32,))

    def f(x):
        return torch.sin(x) * 3

    x = torch.randn(5, dtype=torch.float64)
    torch.testing.assert_close(torch.compile(f, backend="tccd")(x), f(x), rtol=1e-12, atol=1e-12)
    s = tccd.stats()
    assert s["compiled_ops"] == 0 and s["fallback_ops"] == 2
    reasons = s["graphs_detail"][0]["reasons"]
    assert any("float64" in why for why in reasons), reasons


def test_nodes_the_daemon_refuses_are_learned(daemon, rpc_table, caplog):
    """A table that claims an op the daemon then refuses (UNIMPLEMENTED,
    naming the node): setup partitions again without that node, so the
    ops around it still compile; the answer is right and the op counted."""
    import logging

    caplog.set_level(logging.INFO, logger="tccd")
    rpc_table(dict(POINTWISE, **{"aten.cumsum.default": "reduction"}))

    def f(x):
        a = torch.cumsum(torch.sin(x) * 2, 0)   # first proposed as one partition
        return torch.exp(a) - 1

    x = torch.randn(7, 3)
    torch.testing.assert_close(torch.compile(f, backend="tccd")(x).double(),
                               f(x.double()), **F64)
    s = tccd.stats()
    assert s["fallback_ops"] == 1 and s["compiled_ops"] == 4, s
    assert tccd.fallback_ops() == {"aten.cumsum.default": 1}
    assert any("partitioning again" in r.getMessage() for r in caplog.records if r.name == "tccd")
    reasons = s["graphs_detail"][0]["reasons"]
    assert any("refused by the daemon" in why for why in reasons), reasons


def _fx(f, *args):
    gm = make_fx(f)(*args)
    for n in gm.graph.nodes:       # make_fx records metadata under "val"
        assert n.op not in ("call_function", "placeholder") or "val" in n.meta
    return gm


def test_views_never_leave_a_partition():
    """A view op may be inside a partition only while its result stays
    there: a view returned or used outside is computed eagerly."""
    table = P.OpTable("rpc", dict(POINTWISE, **{"aten.permute.default": "view",
                                                 "aten.view.default": "view"}),
                      (torch.float32,))

    def f(x):
        inner = torch.sin(x.permute(1, 0))          # permute used inside only
        leaving = torch.cos(x).view(-1)             # view returned
        return inner, leaving

    gm = _fx(f, torch.randn(3, 4))
    verdict, trials = P.verdicts(gm, table)
    assert trials == 0
    parts = P.propose(gm, verdict, table)
    members = {n.name: i for i, p in enumerate(parts) for n in p}
    views = {n.name: n for n in gm.graph.nodes if n.op == "call_function"
             and str(n.target) in ("aten.permute.default", "aten.view.default")}
    assert len(views) == 2
    permute = next(k for k in views if k.startswith("permute"))
    view = next(k for k in views if k.startswith("view"))
    assert permute in members                                    # kept inside
    assert view not in members                                   # leaves: eager
    assert "leaves" in verdict[views[view]][1]


def test_multi_output_ops_and_getitem_stay_together():
    table = P.OpTable("rpc", dict(POINTWISE, **{"aten.native_layer_norm.default": "reduction"}),
                      (torch.float32,))

    def f(x, w, b):
        y = torch.ops.aten.native_layer_norm.default(x, [4], w, b, 1e-5)
        return torch.relu(y[0]) + 1

    gm = _fx(f, torch.randn(2, 4), torch.randn(4), torch.randn(4))
    verdict, _ = P.verdicts(gm, table)
    parts = P.propose(gm, verdict, table)
    assert len(parts) == 1
    names = {str(n.target) for n in parts[0]}
    assert "aten.native_layer_norm.default" in names and str(operator.getitem) in {
        str(n.target) for n in parts[0]}
