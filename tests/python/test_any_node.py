"""Any node starts warm (issue 22 item 1): a graph's AOTAutograd result and
partitioning go to the daemon as a plan (tccd/plan.py) once its graphs
have run, and a process whose node has no AOTAutogradCache entry sets the
graph up from that plan -- no trace, no partitioning -- with eager's
results and gradients. A plan this process cannot trust or use (an
operator, class or attribute off the allow-lists, a field it does not
know, another torch or package, broken tensors, a graph that does not
hang together) is refused and the graph traced as before; one whose
kernels do not fit the inputs is partitioned again from the plan's
source graph.

The in-process tests keep plans in a dict in place of the daemon's store
(the daemon's checks, signatures and remote tier are
tests/integration/test_plans.py's); the last test runs two processes
against a real daemon."""
import copy
import os

import pytest
import torch

import tccd
from conftest import run_child
from tccd import client as C
from tccd import plan as PL
from tccd._proto import tcc_pb2 as pb

TOL = dict(rtol=1e-4, atol=1e-5)


class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        h = self.up(self.norm(x))
        return x + self.down(torch.nn.functional.gelu(h)).softmax(-1)


@pytest.fixture
def store(monkeypatch, daemon):
    """Plans kept in a dict instead of the daemon's store; plans on. Plans
    still being sent (by an earlier test's graphs) are sent before the
    dict is put in place, and this test's before it is taken away: each
    test's plans land in its own dict."""
    assert PL.flush(60)
    plans = {}

    def put_plan(self, p):
        if p.key in plans:
            return False
        plans[p.key] = p.SerializeToString()
        return True

    def get_plan(self, key):
        return (plans[key], pb.HIT) if key in plans else None

    monkeypatch.setattr(C.Client, "put_plan", put_plan, raising=False)
    monkeypatch.setattr(C.Client, "get_plan", get_plan, raising=False)
    monkeypatch.setenv("TCCD_PLANS", "1")
    yield plans
    assert PL.flush(60)


def _node(monkeypatch, tmp_path, name):
    """A fresh node: its own (empty) TORCHINDUCTOR_CACHE_DIR, Dynamo reset;
    plans still being sent are sent first (their counts would land in
    this node's stats)."""
    assert PL.flush(60)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / name))
    torch._dynamo.reset()
    tccd.reset_stats()


def _step(model):
    """One training step of a compiled copy and of eager on fresh inputs:
    outputs and gradients must agree."""
    ref = copy.deepcopy(model)
    x = torch.randn(8, 32)
    out = torch.compile(model, backend="tccd")(x)
    out.square().sum().backward()
    expect = ref(x)
    expect.square().sum().backward()
    torch.testing.assert_close(out, expect, **TOL)
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL)
    model.zero_grad()


def _made(monkeypatch, tmp_path, store):
    """A model trained one step on node "a": its plan is in the store."""
    model = Block()
    _node(monkeypatch, tmp_path, "a")
    _step(model)
    assert PL.flush(60)
    assert tccd.stats()["plans_sent"] == 1 and len(store) == 1, tccd.stats()
    return model


def test_another_node_sets_up_from_the_plan(monkeypatch, tmp_path, store):
    model = _made(monkeypatch, tmp_path, store)
    (key, data), = store.items()
    p = pb.Plan.FromString(data)
    assert p.key == key and p.HasField("backward") and p.forward.kind == "forward"
    assert p.forward.partitions and p.forward.partitions[0].kernels

    _node(monkeypatch, tmp_path, "b")
    _step(model)
    s = tccd.stats()
    assert s["plan_hits"] == 1 and s["plan_misses"] == 0 and s["aot_cache_hits"] == 0, s
    assert s["cache_miss"] == 0, "another node compiles nothing"
    assert [g["from_plan"] for g in s["graphs_detail"]] == [True, True]
    assert not os.path.exists(tmp_path / "b" / "aotautograd"), "a plan hit writes no local entry"


def _ops_of(p):
    return [n for n in p.forward.partitioned.nodes if n.op == "call_function"]


def _mutations():
    """name -> f(Plan) that makes it one this process must refuse."""
    def op_off_the_list(p):
        p.forward.partitioned.nodes[-1].op = "call_function"
        p.forward.partitioned.nodes[-1].target = "builtins::eval.default"

    def object_off_the_list(p):
        meta = p.result.dict.values[0]
        meta.object.type = "Popen"

    def shadowing_attribute(p):
        f = p.result.dict.values[0].object.fields.add(name="__class__")
        f.value.type_ref = "Tensor"

    def method_attribute(p):
        w = p.result.dict.values[1].list.items[0]
        w.object.fields.add(name="post_compile").value.integer = 1

    def missing_field(p):
        del p.result.dict.values[0].object.fields[0]

    def node_from_the_future(p):
        out = p.forward.partitioned.nodes[-1]
        out.args.tuple.items[0].tuple.items[0].node = len(p.forward.partitioned.nodes) + 5

    def unknown_field(p):
        pass                            # (its bytes are appended to the encoded plan)

    def other_torch(p):
        p.torch_version = "1.13.0 deadbeef"

    def other_package(p):
        p.package = "0" * 64

    def broken_tensor(p):
        for pp in p.forward.partitions:
            for v in pp.constants.dict.values:
                v.tensor.data = v.tensor.data[:-1]
                return
        c = p.forward.partitioned.constants.add(name="c0")
        c.value.tensor.dtype = "float32"
        c.value.tensor.sizes.append(4)
        c.value.tensor.strides.append(1)
        c.value.tensor.data = b"\0" * 15

    def odd_partition_name(p):
        p.forward.partitions[0].name = "os.system"

    def other_kind(p):
        p.forward.kind = "inference"

    def a_call_of_no_partition(p):
        for n in p.forward.partitioned.nodes:
            if n.op == "call_module":
                n.target = "tccd_99"
                return

    def value_of_no_kind(p):
        p.forward.record.Clear()

    return dict(op_off_the_list=op_off_the_list, object_off_the_list=object_off_the_list,
                shadowing_attribute=shadowing_attribute, method_attribute=method_attribute,
                missing_field=missing_field, node_from_the_future=node_from_the_future,
                unknown_field=unknown_field, other_torch=other_torch, other_package=other_package,
                broken_tensor=broken_tensor, odd_partition_name=odd_partition_name,
                other_kind=other_kind, a_call_of_no_partition=a_call_of_no_partition,
                value_of_no_kind=value_of_no_kind)


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_a_plan_it_cannot_use_is_refused_and_the_graph_traced(monkeypatch, tmp_path, store,
                                                             name, caplog):
    model = _made(monkeypatch, tmp_path, store)
    (key, data), = store.items()
    p = pb.Plan.FromString(data)
    _mutations()[name](p)
    forged = p.SerializeToString()
    if name == "unknown_field":
        forged += b"\xa8\x06\x01"       # field 101, varint 1: no field of tcc.v1.Plan
    store[key] = forged

    _node(monkeypatch, tmp_path, "b")
    with caplog.at_level("INFO", logger="tccd"):
        _step(model)
    s = tccd.stats()
    assert s["plan_hits"] == 0 and s["plans_refused"] == 1, s
    assert not any(g.get("from_plan") for g in s["graphs_detail"])
    assert "not using the daemon's plan" in caplog.text


def test_kernels_that_do_not_fit_partition_the_plans_source_graph(monkeypatch, tmp_path, store,
                                                                  caplog):
    model = _made(monkeypatch, tmp_path, store)
    (key, data), = store.items()
    p = pb.Plan.FromString(data)
    for part in (p.forward, p.backward):
        for pp in part.partitions:
            for k in pp.kernels:        # a first input one row longer than ever seen
                k.signature.tuple.items[0].tuple.items[1].size.items[0].integer += 1
    store[key] = p.SerializeToString()

    _node(monkeypatch, tmp_path, "b")
    with caplog.at_level("INFO", logger="tccd"):
        _step(model)
    s = tccd.stats()
    assert s["plan_hits"] == 1, s
    assert "inputs laid out as the recipe never saw; partitioning" in caplog.text
    assert s["cache_miss"] == 0, "the graph partitioned again is the one compiled before"


def test_values_round_trip_and_what_cannot_be_planned():
    from torch._functorch._aot_autograd.schemas import OutputType

    vals = [None, True, -3, 2.5, "x", b"\x01", (1, [2, {"a": 3}]), torch.Size([2, 3]),
            {1, 2}, torch.float16, torch.device("cpu"), torch.strided, torch.channels_last,
            OutputType.non_alias, torch.Tensor]
    for v in vals:
        assert PL.decode_value(PL.encode_value(v)) == v, v
    t = torch.randn(3, 4).t()
    u = PL.decode_value(PL.encode_value(t))
    assert torch.equal(u, t) and u.stride() == t.stride()
    for bad in (object(), torch.device("meta"), lambda: 0, torch.ops.aten.mm.default,
                torch.randn(1 << 19), os.system):
        with pytest.raises(PL.Unplannable):
            PL.encode_value(bad)


def test_another_process_on_another_node_with_a_real_daemon(own_daemon, tmp_path):
    d = own_daemon()
    env = {"TCCD_PLANS": "1"}
    cold = run_child("warm_child.py", ["mlp"], d.addr, tmp_path / "node1", env=env)
    assert cold["plans_sent"] == 2 and cold["plan_hits"] == 0, cold   # foo, and mlp's step
    before = d.stats()
    assert before["plans"] == 2, before
    other = run_child("warm_child.py", ["mlp"], d.addr, tmp_path / "node2", env=env)
    after = d.stats()
    print("another node:", other)
    assert other["plan_hits"] == 2 and other["aot_cache_hits"] == 0, other
    assert other["cache_miss"] == 0 and after["compiles"] == before["compiles"]
    assert other["plans_sent"] == 0 and after["plans"] == 2


def test_a_plan_tampered_in_the_daemons_store_is_not_used(own_daemon, tmp_path):
    """A plan whose bytes were changed in the daemon's SQLite store (its
    digest made to match, so only the signature can tell) is refused, and
    the process on another node traces, with eager's results."""
    import hashlib
    import sqlite3

    d = own_daemon()
    env = {"TCCD_PLANS": "1"}
    run_child("warm_child.py", ["mlp"], d.addr, tmp_path / "node1", env=env)
    db = sqlite3.connect(os.path.join(d.cache_dir, "cache.db"), timeout=30)
    rows = db.execute("SELECT key, plan FROM plans").fetchall()
    assert len(rows) == 2
    for key, data in rows:              # the same plan but for one number of its graph record
        p = pb.Plan.FromString(data)
        p.forward.record.dict.values[0].integer += 1
        forged = p.SerializeToString()
        db.execute("UPDATE plans SET plan = ?, plan_sha256 = ? WHERE key = ?",
                   (forged, hashlib.sha256(forged).digest(), key))
    db.commit()
    db.close()
    other = run_child("warm_child.py", ["mlp"], d.addr, tmp_path / "node2", env=env)
    print("another node:", other)
    assert other["plan_hits"] == 0 and other["plan_misses"] == 2, other
    assert other["cache_miss"] == 0, "traced, and every kernel still a hit"
    assert "fails verification" in d.read_log()
