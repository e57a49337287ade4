"""
Hostile requests: nothing a client sends reaches generated C or compiler
flags except through validated channels. Value names with quotes,
newlines, comment terminators, format strings, NULs, shell and
preprocessor syntax and 10 kB lengths; hostile op targets, argument names,
targets and features; huge, negative and non-finite numbers. Each request
either compiles into a kernel that computes the right thing or is refused
with INVALID_ARGUMENT (UNIMPLEMENTED for an op the daemon does not know,
RESOURCE_EXHAUSTED for a documented limit) — never INTERNAL, never a
crash — and the daemon keeps serving, with one log line per event.
"""
import copy
import json
import os
import subprocess

import grpc
import numpy as np
import pytest
from google.protobuf import json_format

from conftest import TCC_RUN, load_request_json

COMPILE = "/tcc.v1.Compiler/Compile"
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNIMPLEMENTED, grpc.StatusCode.RESOURCE_EXHAUSTED}

HOSTILE_NAMES = [
    'x"; system("id"); "',
    "a\nb\r\nc",
    "*/ int evil = 1; /*",
    "// line comment",
    "%n%s%x%n%p",
    "with\0nul",
    "#include </etc/passwd>",
    "__attribute__((constructor)) void f(void)",
    "$(id)`id`${IFS}",
    "\\\\\\\"",
    "\u202eevil\u202c",
    "\x1b[31mred\x1b[0m",
    "A" * 10240,
    "??/",
]


def request(rows, rename=None):
    """sin_cos with `rows` rows (a new guard hash) and value names mapped."""
    req = load_request_json("sin_cos.json")
    g = req["graph"]
    rename = rename or {}
    for v in g["values"]:
        v["meta"]["sizes"] = [rows, 10]
        v["name"] = rename.get(v["name"], v["name"])
    g["inputs"] = [rename.get(n, n) for n in g["inputs"]]
    g["outputs"] = [rename.get(n, n) for n in g["outputs"]]
    for node in g["nodes"]:
        node["outputs"] = [rename.get(n, n) for n in node["outputs"]]
        for a in node["inputs"]:
            t = a["arg"].get("asTensor")
            if t:
                t["name"] = rename.get(t["name"], t["name"])
    return req


def send(d, req_json, pb):
    payload = json_format.ParseDict(req_json, pb.CompileRequest()).SerializeToString()
    with grpc.insecure_channel(d.addr, options=[("grpc.max_send_message_length", 64 << 20)]) as ch:
        raw = ch.unary_unary(COMPILE, request_serializer=None, response_deserializer=None)(payload, timeout=120)
    return pb.CompileResponse.FromString(raw)


def outcome(d, req_json, pb):
    """'compiled' or the refusal's status; fails on anything else."""
    try:
        r = send(d, req_json, pb)
    except grpc.RpcError as e:
        assert e.code() in REFUSALS, f"{e.code()}: {e.details()[:300]}"
        return e.code()
    assert r.cache in (pb.MISS, pb.HIT, pb.COALESCED)
    return "compiled"


def run_checked(d, req_json, rows, tmp_path):
    """Runs the request through tcc-run on fresh random inputs and checks
    sin(x) + cos(y) against float64."""
    path = tmp_path / "req.json"
    path.write_text(json.dumps(req_json))
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    x, y = (rng.standard_normal((rows, 10)).astype(np.float32) * 3 for _ in range(2))
    (tmp_path / "x").write_bytes(x.tobytes())
    (tmp_path / "y").write_bytes(y.tobytes())
    p = subprocess.run([TCC_RUN, d.addr, str(path), str(tmp_path / "x"), str(tmp_path / "y"), "--",
                        str(tmp_path / "o")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[:500]
    got = np.fromfile(tmp_path / "o", dtype=np.float32).reshape(rows, 10)
    want = np.sin(x.astype(np.float64)) + np.cos(y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")


def assert_serving(d):
    assert d.tcctl("health", json_out=False, check=False).returncode == 0
    assert d.proc.poll() is None, "tccd died"


def test_hostile_value_names(daemon_factory, pb, tmp_path):
    d = daemon_factory().start()
    compiled = 0
    for i, name in enumerate(HOSTILE_NAMES):
        rows = 40 + i  # a new guard hash each time: every name reaches codegen
        # the hostile name on an input, an intermediate and the output
        req = request(rows, {"x": name, "sin": name + "_s", "add": name + "_o"})
        got = outcome(d, req, pb)
        if got == "compiled":
            compiled += 1
            if "\0" not in name:  # tcc-run reads JSON; NUL survives protobuf, not every C string API
                run_checked(d, req, rows, tmp_path)
        else:
            assert got == grpc.StatusCode.INVALID_ARGUMENT, (name[:40], got)
        assert_serving(d)
    assert compiled >= len(HOSTILE_NAMES) // 2, "most names are just names"
    # a duplicate name is refused; an empty one is just another name
    dup = request(60, {"y": "x"})
    assert outcome(d, dup, pb) == grpc.StatusCode.INVALID_ARGUMENT
    empty = request(61, {"x": ""})
    assert outcome(d, empty, pb) in ("compiled", grpc.StatusCode.INVALID_ARGUMENT)
    assert d.stop() == 0
    # one line per log event: nothing a client sent split or forged a line
    for line in d.read_log().splitlines():
        assert line[:4].isdigit() or line.startswith("==") or not line.strip(), f"forged log line: {line[:120]!r}"
    assert "\x1b[31m" not in d.read_log()


def test_hostile_targets_ops_and_numbers(daemon_factory, pb, tmp_path):
    d = daemon_factory().start()
    base = request(70)
    cases = []

    def case(what, mutate):
        r = copy.deepcopy(base)
        mutate(r)
        cases.append((what, r))

    case("op with a quote", lambda r: r["graph"]["nodes"][0].update(target='aten.sin.default"; int x; "'))
    case("op with newline", lambda r: r["graph"]["nodes"][0].update(target="aten.sin.default\n#define x"))
    case("argument name", lambda r: r["graph"]["nodes"][0]["inputs"][0].update(name='self*/"%n'))
    case("10 kB op", lambda r: r["graph"]["nodes"][0].update(target="aten." + "s" * 10240 + ".default"))
    case("isa injection", lambda r: r["target"].update(cpuIsa="x86-64 -o /tmp/pwn"))
    case("feature injection", lambda r: r["target"].update(cpuFeatures=["-fplugin=/tmp/x.so"]))
    case("feature with space", lambda r: r["target"].update(cpuFeatures=["avx2 -O0"]))
    case("cuda arch injection", lambda r: r["target"].update(device="CUDA", cudaArch="sm_90 -I/etc"))
    case("huge sizes", lambda r: [v["meta"].update(sizes=[2 ** 62, 2 ** 62]) for v in r["graph"]["values"]])
    case("negative size", lambda r: [v["meta"].update(sizes=[-5, 10]) for v in r["graph"]["values"]])
    case("huge stride", lambda r: r["graph"]["values"][0]["meta"].update(strides=[2 ** 63 - 1, 1]))
    case("huge offset", lambda r: r["graph"]["values"][0]["meta"].update(storageOffset=str(2 ** 62)))
    case("negative stride", lambda r: r["graph"]["values"][0]["meta"].update(strides=[-10, 1]))
    case("rank 40", lambda r: [v["meta"].update(sizes=[1] * 40, strides=[1] * 40) for v in r["graph"]["values"]])
    case("unknown dtype", lambda r: r["graph"]["values"][0]["meta"].update(dtype=999))
    case("dangling input", lambda r: r["graph"]["nodes"][0]["inputs"][0]["arg"]["asTensor"].update(name="nope"))
    case("10k inputs list", lambda r: r["graph"].update(inputs=["x"] * 10000))
    case("format string client", lambda r: r.update(client="%n%n%n%s%s%s\n" * 1000))
    for alpha in ("NaN", "Infinity", "-Infinity", 1e308, -1e-320):
        case(f"alpha {alpha}", lambda r, a=alpha: r["graph"]["nodes"][2]["inputs"].append(
            {"name": "alpha", "arg": {"asFloat": a}}))
    case("alpha huge int", lambda r: r["graph"]["nodes"][2]["inputs"].append(
        {"name": "alpha", "arg": {"asInt": str(2 ** 63 - 1)}}))

    results = {}
    for i, (what, r) in enumerate(cases):
        for v in r["graph"]["values"]:  # a fresh guard hash per case where shapes allow
            if v["meta"]["sizes"] == [70, 10]:
                v["meta"]["sizes"] = [100 + i, 10]
        results[what] = outcome(d, r, pb)
        assert_serving(d)
    for what in ("op with a quote", "op with newline", "argument name", "10 kB op", "isa injection",
                 "feature injection", "feature with space", "cuda arch injection", "negative size",
                 "unknown dtype", "dangling input", "negative stride", "huge sizes"):
        assert results[what] != "compiled", f"{what} must be refused"
    assert results["format string client"] == "compiled", "the client label is only a label"
    # a well-formed request still compiles and runs afterwards
    run_checked(d, request(9), 9, tmp_path)
    s = d.stats()
    assert s["invalid_requests"] >= 10
    assert d.stop() == 0
    assert "%n%n%n" not in d.read_log() or "\\n" in d.read_log()


def test_malformed_bytes_are_explained_with_their_offset(daemon_factory, pb):
    """Bytes that do not decode as a CompileRequest get INVALID_ARGUMENT
    with the compiler decoder's field path and byte offset (the daemon
    decodes with it, small requests on the loop, large ones on an offload
    thread), and the daemon keeps serving."""
    d = daemon_factory().start()
    good = json_format.ParseDict(load_request_json("sin_cos.json"), pb.CompileRequest()).SerializeToString()
    big = pb.CompileRequest()
    big.CopyFrom(json_format.ParseDict(load_request_json("sin_cos.json"), pb.CompileRequest()))
    big.client = "x" * (200 << 10)  # over the 64 KiB inline limit: prepared off the loop
    with grpc.insecure_channel(d.addr) as ch:
        call = ch.unary_unary(COMPILE, request_serializer=None, response_deserializer=None)
        for payload in (good[:-3], big.SerializeToString()[:-3], b"\x0a\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff"):
            with pytest.raises(grpc.RpcError) as e:
                call(payload, timeout=30)
            assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
            assert e.value.details().startswith("malformed CompileRequest: "), e.value.details()
            assert "byte" in e.value.details(), e.value.details()
        assert pb.CompileResponse.FromString(call(good, timeout=60)).cache == pb.MISS
    assert d.stop() == 0
