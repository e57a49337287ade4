"""tccd.prewarm (issue 22 item 3): a model's graphs compiled for targets
this process does not have -- another x86-64 level, a CUDA arch through
the daemon's NVRTC with no GPU -- so that a job of that target then finds
every kernel in the daemon's cache; the model's gradients are left as
they were; bad target specs are refused."""
import pytest
import torch

import tccd
from tccd import targets as T
from tccd._proto import tcc_pb2 as pb

TOL = dict(rtol=1e-4, atol=1e-5)


class Block(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 4 * d)
        self.down = torch.nn.Linear(4 * d, d)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


OTHER_CPU = "cpu:x86-64"     # the baseline level: never this host's (>= v2)


def test_prewarm_then_a_job_of_that_target_only_hits(own_daemon):
    d = own_daemon()
    model = Block()
    x = torch.randn(8, 32, requires_grad=True)   # as the job passes it: the backward differs without
    report = tccd.prewarm(model, (x,), targets=[OTHER_CPU], backward=True, aot_cache=False)
    r = report[OTHER_CPU]
    print(report)
    assert r["failed"] == 0, r["errors"]
    assert r["compiled"] >= 2 and r["present"] == 0   # forward and backward kernels
    assert all(p.grad is None for p in model.parameters()) and x.grad is None, "prewarm left gradients behind"
    assert T._active is None
    entries = {e["target"] for e in d.tcctl("ls", "--limit", "1000").get("entries", [])}
    assert "cpu:x86-64" in entries
    compiles = d.stats()["compiles"]

    # a job on a baseline x86-64 node: every kernel a hit, results as eager
    torch._dynamo.reset()
    tccd.reset_stats()
    xr = torch.randn(8, 32, requires_grad=True)
    xe = xr.detach().clone().requires_grad_(True)
    m = torch.compile(model, backend=tccd.backend(cpu_isa="x86-64", aot_cache=False))
    out = m(xr)
    out.square().sum().backward()
    ref_model = Block()
    ref_model.load_state_dict(model.state_dict())
    ref = ref_model(xe)
    ref.square().sum().backward()
    torch.testing.assert_close(out, ref, **TOL)
    torch.testing.assert_close(xr.grad, xe.grad, **TOL)
    s = tccd.stats()
    assert s["cache_miss"] == 0 and s["cache_hit"] == s["kernels"] >= 2, s
    assert d.stats()["compiles"] == compiles


def test_prewarm_cuda_arch_from_a_cpu_process(own_daemon):
    d = own_daemon()
    model = Block()
    report = tccd.prewarm(model, (torch.randn(4, 32),), targets=["cuda:sm_90", "cuda:sm_90"])
    r = report["cuda:sm_90"]
    if r["failed"] and all("NVRTC not available" in e for e in r["errors"]):
        pytest.skip("this build has no NVRTC (scripts/setup-cuda)")
    assert list(report) == ["cuda:sm_90"]              # duplicates once
    assert r["failed"] == 0 and r["compiled"] >= 1, r
    targets = [e["target"] for e in d.tcctl("ls").get("entries", [])]
    assert targets.count("cuda:sm_90") == r["compiled"]


def test_retarget_and_bad_specs(own_daemon):
    own_daemon()
    req = pb.CompileRequest()
    v = req.graph.values.add(name="x")
    v.meta.device.type = pb.CPU
    req.graph.values.add(name="noted")            # no meta: left alone
    req.target.CopyFrom(pb.Target(device=pb.CPU, cpu_isa="x86-64-v2"))
    out = T.retarget(req, "cpu:x86-64-v3+avx512bf16")
    assert (out.target.cpu_isa, list(out.target.cpu_features)) == ("x86-64-v3", ["avx512bf16"])
    out = T.retarget(req, "cuda:sm_90a")
    assert out.target.device == pb.CUDA and out.target.cuda_arch == "sm_90a"
    assert out.graph.values[0].meta.device.type == pb.CUDA and not out.graph.values[1].HasField("meta")
    assert req.target.cpu_isa == "x86-64-v2" and req.graph.values[0].meta.device.type == pb.CPU
    for bad in ("gpu", "cuda", "cuda:90", "cpu:", "cpu:x86-64-v3+", 7):
        with pytest.raises(ValueError, match="a target is cpu"):
            tccd.prewarm(Block(), (torch.randn(2, 32),), targets=[bad])
    assert T._active is None
