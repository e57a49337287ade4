"""
End to end through the real daemon: the seed graph foo(x, y) = sin(x) +
cos(y) compiles (miss), hits with the same guard hash, still hits after a
restart, and the kernel that libtccclient loads computes the right thing on
fresh random inputs. Also every tcctl command against a live daemon.
"""
import json
import os
import subprocess
import time

import numpy as np
import pytest

from conftest import GRAPHS, TCC_RUN, load_request_json

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")


def run_graph(addr, request_path, inputs, out_shapes, tmp_path, out_dtype=np.float32):
    """Runs a request through tcc-run (libtccclient: compile, fetch, verify,
    dlopen, run) and returns (result line, outputs)."""
    in_files = []
    for i, a in enumerate(inputs):
        p = tmp_path / f"in{i}.bin"
        p.write_bytes(np.ascontiguousarray(a).tobytes())
        in_files.append(str(p))
    out_files = [str(tmp_path / f"out{i}.bin") for i in range(len(out_shapes))]
    p = subprocess.run([TCC_RUN, addr, request_path, *in_files, "--", *out_files],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    outs = [np.fromfile(f, dtype=out_dtype).reshape(s) for f, s in zip(out_files, out_shapes)]
    return json.loads(p.stdout), outs


def random_inputs(seed, *shapes, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) * 3 for s in shapes]


def test_seed_graph_miss_hit_restart_hit(daemon_factory, tmp_path):
    d = daemon_factory().start()
    first = d.tcctl("compile", SIN_COS)
    assert first["cache"] == "miss"
    assert len(first["guard_hash"]) == 64
    assert len(first["artifact_sha256"]) == 64
    assert first["kernels"] >= 1

    second = d.tcctl("compile", SIN_COS)
    assert second["cache"] == "hit"
    assert second["guard_hash"] == first["guard_hash"]
    assert second["artifact_sha256"] == first["artifact_sha256"]

    s = d.stats()
    assert s["compiles"] == 1 and s["misses"] == 1 and s["hits"] == 1 and s["entries"] == 1

    assert d.stop() == 0
    d.start()
    third = d.tcctl("compile", SIN_COS)
    assert third["cache"] == "hit"
    assert third["guard_hash"] == first["guard_hash"]
    s = d.stats()
    assert s["compiles"] == 1, "counters must persist across a restart"
    assert s["hits"] == 2

    seed = int(time.time_ns() % 2**32)
    x, y = random_inputs(seed, (10, 10), (10, 10))
    line, (out,) = run_graph(d.addr, SIN_COS, [x, y], [(10, 10)], tmp_path)
    assert line["cache"] == "hit" and line["guard_hash"] == first["guard_hash"]
    ref = np.sin(x.astype(np.float64)) + np.cos(y.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=f"seed {seed}")
    assert d.stop() == 0


def test_kernel_output_on_fresh_daemon_matches_numpy(daemon, tmp_path):
    seed = int(time.time_ns() % 2**32)
    x, y = random_inputs(seed, (10, 10), (10, 10))
    line, (out,) = run_graph(daemon.addr, SIN_COS, [x, y], [(10, 10)], tmp_path)
    assert line["cache"] == "miss"
    ref = np.sin(x.astype(np.float64)) + np.cos(y.astype(np.float64))
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6, err_msg=f"seed {seed}")


def test_float64_graph_with_more_ops(daemon, tmp_path):
    """A float64 chain of the foundation's pointwise ops, fused into one loop."""
    req = load_request_json("pointwise_chain_f64.json")
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req))
    shape = tuple(int(s) for s in req["graph"]["values"][0]["meta"]["sizes"])
    seed = int(time.time_ns() % 2**32)
    rng = np.random.default_rng(seed)
    x = rng.uniform(0.5, 4.0, shape)  # log/sqrt need positive inputs
    y = rng.uniform(-3.0, 3.0, shape)
    line, (out,) = run_graph(daemon.addr, str(path), [x, y], [shape], tmp_path, out_dtype=np.float64)
    assert line["kernels"] == 1, "a pointwise chain over one shape is one fused kernel"
    t = np.log(x) * np.sqrt(x) - np.exp(-np.abs(y))
    ref = np.tanh(t) + 1.0 / (1.0 + np.exp(-y)) / np.maximum(x, 0.0) - np.cos(np.sin(y))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-12, err_msg=f"seed {seed}")


def test_tcctl_commands(daemon, tmp_path):
    assert daemon.tcctl("health", json_out=False, check=False).returncode == 0
    c = daemon.tcctl("compile", SIN_COS)
    h = c["guard_hash"]

    ls = daemon.tcctl("ls")
    entries = ls["entries"] if isinstance(ls, dict) else ls
    assert [e["guard_hash"] for e in entries] == [h]

    show = daemon.tcctl("show", h)
    assert json.dumps(show).find(h) >= 0

    out = tmp_path / "kernel.so"
    daemon.tcctl("fetch", h, str(out), json_out=False)
    data = out.read_bytes()
    import hashlib
    assert hashlib.sha256(data).hexdigest() == c["artifact_sha256"]
    assert data[:4] == b"\x7fELF"

    # human output is a table, not JSON
    text = daemon.tcctl("stats", json_out=False)
    assert "hits" in text and "entries" in text

    daemon.tcctl("evict", h, json_out=False)
    p = daemon.tcctl("show", h, check=False)
    assert p.returncode != 0 and "NOT_FOUND" in p.stderr
    p = daemon.tcctl("evict", h, check=False)
    assert p.returncode != 0

    again = daemon.tcctl("compile", SIN_COS)
    assert again["cache"] == "miss" and again["guard_hash"] == h
    gc = daemon.tcctl("gc")
    assert isinstance(gc, dict)
    s = daemon.stats()
    for key in ("entries", "bytes", "hits", "misses", "coalesced", "compiles",
                "compile_failures", "evictions"):
        assert key in s, key
    assert s["compiles"] == 2 and s["entries"] == 1


def test_bad_requests_over_the_wire(daemon, tmp_path):
    """Each bad request gets its status and a message naming the problem;
    the daemon keeps serving."""
    req = load_request_json("sin_cos.json")

    def compile_json(obj):
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(obj))
        return daemon.tcctl("compile", str(p), check=False)

    bad = json.loads(json.dumps(req))
    bad["graph"]["nodes"][2]["inputs"][1]["arg"]["asTensor"]["name"] = "nope"
    r = compile_json(bad)
    assert r.returncode != 0 and "INVALID_ARGUMENT" in r.stderr and "nope" in r.stderr

    bad = json.loads(json.dumps(req))
    bad["graph"]["nodes"][0]["target"] = "aten.frobnicate.default"
    r = compile_json(bad)
    assert r.returncode != 0 and "UNIMPLEMENTED" in r.stderr and "aten.frobnicate.default" in r.stderr

    bad = json.loads(json.dumps(req))
    bad["graph"]["values"][0]["meta"]["sizes"] = [-1, 10]
    r = compile_json(bad)
    assert r.returncode != 0 and "INVALID_ARGUMENT" in r.stderr

    bad = json.loads(json.dumps(req))
    bad["graph"]["nodes"] = []
    bad["graph"]["outputs"] = []
    r = compile_json(bad)
    assert r.returncode != 0 and "INVALID_ARGUMENT" in r.stderr

    ok = daemon.tcctl("compile", SIN_COS)
    assert ok["cache"] == "miss"
    assert daemon.stats()["invalid_requests"] >= 4


def dot_clusters(dot):
    """{cluster label: [node labels]} and the dashed (kernel-less) nodes of
    a `tcctl show --dot` drawing."""
    import re
    clusters, dashed, cur = {}, [], None
    for line in dot.splitlines():
        line = line.strip()
        if line.startswith("subgraph cluster_"):
            cur = None
        elif line.startswith("label=") and cur is None:
            cur = re.match(r'label="([^"]*)"', line).group(1)
            clusters[cur] = []
        elif line == "}":
            cur = None
        m = re.match(r'n\d+ \[(style=dashed, )?label="([^"]*)"\]', line)
        if m:
            (dashed if m.group(1) else clusters[cur]).append(m.group(2))
    return clusters, dashed


@pytest.mark.parametrize("graph,expect", [
    # foo(x, y) = sin(x) + cos(y): the three ops fuse into one kernel
    ("sin_cos.json", {"k0: pointwise": ["aten.sin.default", "aten.cos.default",
                                        "aten.add.Tensor"]}),
    # softmax and layer_norm: one kernel each
    ("softmax.json", {"k0: reduction": ["aten._softmax.default"]}),
    ("layer_norm.json", {"k0: reduction": ["aten.native_layer_norm.default"]}),
    # linear + bias + gelu: the GEMM extern step, then bias + gelu fused
    ("gelu_mlp.json", {"k0: extern": ["aten.addmm.default"],
                       "k1: pointwise": ["aten.gelu.default"]}),
])
def test_show_dot_draws_the_kernel_grouping(daemon, graph, expect):
    h = daemon.tcctl("compile", os.path.join(GRAPHS, graph))["guard_hash"]
    dot = daemon.tcctl("show", h[:12], "--dot", json_out=False)
    assert dot.startswith('digraph "tccd_') and dot.rstrip().endswith("}")
    assert dot.count("{") == dot.count("}")
    clusters, dashed = dot_clusters(dot)
    got = {label.split(",")[0]: sorted(n.split(": ", 1)[1].split("\\n")[0] for n in nodes)
           for label, nodes in clusters.items()}
    assert got == {k: sorted(v) for k, v in expect.items()}, dot
    if graph == "gelu_mlp.json":
        assert dashed == ["0: aten.permute.default"], dot   # a view: no kernel
    # every input and output is drawn with an edge
    manifest = daemon.tcctl("show", h)["manifest"]
    for i in range(len(manifest["inputs"])):
        assert f"in{i} -> " in dot
    for i in range(len(manifest["outputs"])):
        assert f" -> out{i};" in dot
