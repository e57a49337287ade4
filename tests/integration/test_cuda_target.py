"""
CUDA target end to end against the real tccd: `tcctl compile --target
cuda:sm_XX` of the example graphs gives a cubin artifact whose manifest
describes ABI-1 launches (target, kernels with grid/block, identity naming
NVRTC); the two archs are different cache entries, a second compile hits,
`tcctl fetch` returns an ELF cubin for the right SM, the manifest carries
the PTX, and a graph with a matmul becomes a cuBLAS step (GemmStep) before
its fused epilogue kernel. Skipped when the build has no NVRTC
(scripts/setup-cuda). No GPU needed.
"""
import json
import os
import struct

import pytest

from conftest import GRAPHS, SOURCE



def cuda_json(name, tmp_path):
    """The example graph with its values placed on the CUDA device (a
    request's metas must agree with its target)."""
    with open(os.path.join(GRAPHS, name)) as f:
        req = json.load(f)
    for v in req["graph"]["values"]:
        dev = v.get("meta", {}).get("device")
        if dev is not None:
            dev["type"] = "CUDA"
    out = tmp_path / ("cuda-" + name)
    out.write_text(json.dumps(req))
    return str(out)


@pytest.fixture
def nvrtc_daemon(daemon_factory, tmp_path):
    d = daemon_factory().start()
    probe = d.tcctl("compile", cuda_json("sin_cos.json", tmp_path), "--target", "cuda:sm_80", check=False)
    if probe.returncode != 0 and "NVRTC not available" in probe.stderr:
        d.stop()
        pytest.skip("NVRTC not available (scripts/setup-cuda)")
    yield d
    d.stop()


@pytest.mark.parametrize("graph,kinds", [("softmax.json", ["reduction"]),
                                         ("layer_norm.json", None),
                                         ("sin_cos.json", ["pointwise"]),
                                         ("pointwise_chain_f64.json", None)])
def test_compile_for_cuda(nvrtc_daemon, tmp_path, graph, kinds):
    d = nvrtc_daemon
    path = cuda_json(graph, tmp_path)
    seen = {}
    for arch in ("sm_80", "sm_90"):
        r = d.tcctl("compile", path, "--target", f"cuda:{arch}")
        assert r["artifact_kind"] == "cubin"
        assert r["target"] == f"cuda:{arch}"
        m = r["manifest"]
        assert m["abi_version"] == 1 and m["target"] == f"cuda:{arch}"
        assert "nvrtc " in m["compiler"]
        assert len(m["kernels"]) == r["kernels"] >= 1
        for i, k in enumerate(m["kernels"]):
            assert k["name"] == f"k{i}"
            assert len(k["grid"]) == 1 and k["grid"][0] >= 1
            assert len(k["block"]) == 1 and k["block"][0] % 32 == 0 and k["block"][0] <= 1024
        if kinds:
            assert [k["kind"] for k in m["kernels"]] == kinds
        if graph == "softmax.json":
            assert len(m["kernels"]) == 1, "softmax is one kernel"
        again = d.tcctl("compile", path, "--target", f"cuda:{arch}")
        assert again["cache"] == "hit" and again["guard_hash"] == r["guard_hash"]
        out = tmp_path / f"{arch}.cubin"
        d.tcctl("fetch", r["guard_hash"], str(out), json_out=False)
        elf = out.read_bytes()
        assert elf[:4] == b"\x7fELF" and struct.unpack_from("<H", elf, 18)[0] == 190  # EM_CUDA
        seen[arch] = r["guard_hash"]
    assert seen["sm_80"] != seen["sm_90"], "archs are different cache entries"
    cpu = d.tcctl("compile", os.path.join(GRAPHS, graph))
    assert cpu["guard_hash"] not in seen.values()


def test_matmul_is_a_cublas_step(nvrtc_daemon, tmp_path):
    r = nvrtc_daemon.tcctl("compile", cuda_json("gelu_mlp.json", tmp_path), "--target", "cuda:sm_90")
    m = r["manifest"]
    assert [k["kind"] for k in m["kernels"]] == ["extern", "pointwise"]
    g = m["kernels"][0]["gemm"]
    # gelu(x @ w.T + b), x 512x768, w 3072x768: cuBLAS C^T = w x^T (op T on w)
    assert (g["m"], g["n"], g["k"]) == ("3072", "512", "768") or (g["m"], g["n"], g["k"]) == (3072, 512, 768)
    assert g.get("trans_a") and not g.get("trans_b")
    assert g["compute_type"] == "32F"   # float32 without TF32, like torch's default
    assert g["a"]["input"] == 1 and g.get("b", {}).get("input", 0) == 0 and g["c"]["workspace"]
    assert not m["kernels"][0].get("grid") and m["kernels"][1]["grid"]
    assert m.get("ptx"), "the manifest carries the PTX"
