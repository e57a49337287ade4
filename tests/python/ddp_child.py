"""One rank of test_distributed.py's DDP jobs: DistributedDataParallel
(gloo) around a module compiled with backend="tccd" (or eager,
TCC_DDP_EAGER=1), three SGD steps on rank-specific data; prints a JSON
report (losses, the package's counters; rank_common.py)."""
import os

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import rank_common

rank, world = rank_common.join()
eager = os.environ.get("TCC_DDP_EAGER") == "1"
hashes = None if eager else rank_common.record_guard_hashes()
torch.manual_seed(0)                      # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.Tanh(),
                            torch.nn.Linear(512, 64))
# DDP around the compiled module: torch.compile(DDP(model)) graph-breaks
# inside DDP's forward in torch 2.13 (its C++ Logger) and never calls the
# backend; this form compiles the whole model, DDP's bucket hooks run on
# the gradients the compiled backward returns. Four buckets of about 1 MB.
net = DDP(model if eager else torch.compile(model, backend="tccd"), bucket_cap_mb=1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
losses = rank_common.train(rank, net, opt, 512, 64)
rank_common.finish({"rank": rank, "losses": losses,
                    "buckets": len(net.reducer._get_zeros_like_grad_buckets())
                    if hasattr(net, "reducer") else None,
                    "weight0": model[0].weight.detach().double().sum().item()}, hashes)
