"""One rank of test_distributed.py's FSDP2 jobs: fully_shard (gloo, CPU)
on a model of Linear/LayerNorm blocks and a Linear head, each block
sharded and then the root, three SGD steps (momentum) on rank-specific
data; prints a JSON report (losses, the package's counters;
rank_common.py). Rank 0 saves the parameters, in full, before and after
the steps to $TCC_FSDP_OUT.

$TCC_FSDP_MODE picks the form:
  eager   no compile (the reference)
  layers  each block compiled with backend="tccd" before it is sharded:
          torch.compile(block), then fully_shard on the compiled module
  root    torch.compile(model, backend="tccd") on the sharded model"""
import os

import torch
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor

import rank_common


class Block(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = torch.nn.Linear(dim, dim)
        self.norm = torch.nn.LayerNorm(dim)

    def forward(self, x):
        return x + torch.nn.functional.gelu(self.norm(self.fc(x)))


class Net(torch.nn.Module):
    def __init__(self, dim=256, depth=3, out=64):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(depth))
        self.head = torch.nn.Linear(dim, out)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def full_parameters(model):
    """{name: tensor} of every parameter in full (a sharded one is
    all-gathered: every rank must call this), named as in the eager model."""
    return {n.replace("_orig_mod.", ""): (p.full_tensor() if isinstance(p, DTensor) else p).detach().clone()
            for n, p in model.named_parameters()}


rank, world = rank_common.join()
mode = os.environ["TCC_FSDP_MODE"]
hashes = None if mode == "eager" else rank_common.record_guard_hashes()
torch.manual_seed(0)                      # the same initial weights on every rank
model = Net()
initial = full_parameters(model)
for i, block in enumerate(model.blocks):
    if mode == "layers":
        model.blocks[i] = block = torch.compile(block, backend="tccd")
    fully_shard(block)
fully_shard(model)
net = torch.compile(model, backend="tccd") if mode == "root" else model
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
losses = rank_common.train(rank, net, opt, 256, 64)
final = full_parameters(model)
if rank == 0:
    torch.save({"initial": initial, "final": final}, os.environ["TCC_FSDP_OUT"])
rank_common.finish({"rank": rank, "losses": losses,
                    "sharded": all(isinstance(p, DTensor) for p in model.parameters())}, hashes)
