"""One rank of test_distributed.py: DistributedDataParallel (gloo) around
a module compiled with backend="tccd" (or eager, TCC_DDP_EAGER=1), three
SGD steps on rank-specific data; prints a JSON report (losses, the
package's counters)."""
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
dist.init_process_group("gloo", rank=rank, world_size=world)
torch.manual_seed(0)                      # the same initial weights on every rank
model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.ReLU(), torch.nn.Linear(512, 512),
                            torch.nn.GELU(), torch.nn.Linear(512, 512), torch.nn.Tanh(),
                            torch.nn.Linear(512, 64))
eager = os.environ.get("TCC_DDP_EAGER") == "1"
# DDP around the compiled module: torch.compile(DDP(model)) graph-breaks
# inside DDP's forward in torch 2.13 (its C++ Logger) and never calls the
# backend; this form compiles the whole model, DDP's bucket hooks run on
# the gradients the compiled backward returns. Four buckets of about 1 MB.
net = DDP(model if eager else torch.compile(model, backend="tccd"), bucket_cap_mb=1)
opt = torch.optim.SGD(net.parameters(), lr=0.05)
g = torch.Generator().manual_seed(100 + rank)
losses = []
for step in range(3):
    x = torch.randn(16, 512, generator=g)
    y = torch.randn(16, 64, generator=g)
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.item())
report = {"rank": rank, "losses": losses,
          "buckets": len(net.reducer._get_zeros_like_grad_buckets()) if hasattr(net, "reducer") else None,
          "weight0": model[0].weight.detach().double().sum().item()}
if not eager:
    import tccd
    s = tccd.stats()
    report.update({k: s[k] for k in ("graphs", "ops", "fallback_ops", "compile_requests", "cache_miss",
                                     "cache_hit", "cache_coalesced", "cache_remote_hit")})
dist.destroy_process_group()
print("REPORT " + json.dumps(report))
sys.stdout.flush()
