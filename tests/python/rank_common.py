"""What every rank of test_distributed.py's jobs (ddp_child.py,
fsdp_child.py) does around its training loop: join the gloo group as
torchrun starts a rank (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT from
the environment), train on data of its own (drawn from the test's seed,
$TCC_DIST_SEED, plus the rank), note the guard hash of each compile request, and print the
report the test reads: one line "REPORT {json}"."""
import json
import os
import sys

import torch
import torch.distributed as dist

COUNTERS = ("graphs", "ops", "fallback_ops", "compile_requests", "cache_miss", "cache_hit",
            "cache_coalesced", "cache_remote_hit", "plans_sent", "plan_hits", "aot_cache_hits")


def join():
    """Joins the job's process group; returns (rank, world size)."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    return rank, world


def train(rank, net, opt, inputs, outputs, steps=3):
    """`steps` steps of `opt` on the MSE loss of `net` over batches of 16
    random rows (`inputs` -> `outputs` wide), other data on every rank;
    returns this rank's losses."""
    g = torch.Generator().manual_seed(int(os.environ["TCC_DIST_SEED"]) + rank)
    losses = []
    for _ in range(steps):
        x = torch.randn(16, inputs, generator=g)
        y = torch.randn(16, outputs, generator=g)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def record_guard_hashes():
    """Returns a list that gets the guard hash the daemon answers to each of
    this process's compile requests, in order (a spy on
    tccd.client.Client.get_kernel, which every kernel request goes through)."""
    import tccd.client

    hashes = []
    get_kernel = tccd.client.Client.get_kernel

    def spy(self, request):
        kernel, resp = get_kernel(self, request)
        hashes.append(resp.guard_hash)
        return kernel, resp

    tccd.client.Client.get_kernel = spy
    return hashes


def finish(report, hashes=None):
    """Adds the package's counters (when this rank compiled: `hashes` from
    record_guard_hashes), leaves the group and prints the report."""
    if hashes is not None:
        import tccd
        import tccd.plan

        tccd.plan.flush(60)             # plans are sent in the background
        s = tccd.stats()
        report.update({k: s[k] for k in COUNTERS})
        report.update(hashes=hashes, kinds=[d["kind"] for d in s["graphs_detail"]],
                      fallback=tccd.fallback_ops())
    dist.destroy_process_group()
    print("REPORT " + json.dumps(report))
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without the interpreter's teardown: torch 2.13's gloo worker
    # threads, still owned by DDP's reducer, abort the process about one
    # exit in ten while Python frees them ("terminate called without an
    # active exception", eager jobs as well; pytorch/pytorch#179291).
    os._exit(0)
