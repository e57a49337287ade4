"""partition._one_partition, the partitioner's fast path: whenever it
applies (no unsupported node between two supported ones) it gives exactly
what torch.fx's CapabilityBasedPartitioner gives -- one partition of every
supported node -- on real ATen graphs (a transformer block's forward and
backward) with random verdicts; and it stands back when an unsupported
node does lie between supported ones."""
import operator
import random

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from tccd import partition as P


def _aten_graphs():
    """A transformer encoder layer's joint forward + backward, as ATen."""
    from torch._functorch.aot_autograd import aot_function

    layer = torch.nn.TransformerEncoderLayer(32, 4, 64, dropout=0.0, batch_first=True)
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return gm

    f = aot_function(lambda x, *p: torch.func.functional_call(
        layer, dict(zip([n for n, _ in layer.named_parameters()], p)), (x,)),
        fw_compiler=keep, bw_compiler=keep)
    x = torch.randn(2, 5, 32, requires_grad=True)
    f(x, *layer.parameters()).sum().backward()
    return graphs


def _torch_parts(gm, ok):
    parts = CapabilityBasedPartitioner(gm, P._Support(ok),
                                       allows_single_node_partition=True).propose_partitions()
    return sorted([list(p.nodes) for p in parts], key=len)


def test_fast_path_equals_the_fx_partitioner():
    rng = random.Random(torch.initial_seed())
    applied = declined = 0
    for gm in _aten_graphs():
        calls = [n for n in gm.graph.nodes if n.op == "call_function"]
        assert len(calls) > 30
        for trial in range(40):
            ok = {n: True for n in calls}
            if trial:                    # unsupported: a few random nodes, often sinks or sources
                pool = [n for n in calls if all(u.op == "output" for u in n.users)] \
                    + [n for n in calls if all(a.op == "placeholder" for a in n.all_input_nodes)]
                pick = pool if trial % 2 else calls
                for n in rng.sample(pick, min(len(pick), rng.randint(1, 3))):
                    ok[n] = False
            for n in calls:              # a getitem goes with its source (partition.verdicts)
                if n.target is operator.getitem:
                    ok[n] = ok.get(n.args[0], False)
            fast = P._one_partition(gm, ok)
            if fast is None:
                declined += 1
                continue
            applied += 1
            want = _torch_parts(gm, ok)
            assert [set(p) for p in fast] == [set(p) for p in want], (trial, len(fast[0]))
            order = {n: i for i, n in enumerate(gm.graph.nodes)}
            assert fast[0] == sorted(fast[0], key=order.get)
    assert applied >= 20 and declined >= 5, (applied, declined)
