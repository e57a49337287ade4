"""
Logs (--log-format json) and request ids: every line on tccd's stderr is
one JSON object; lines about a call carry its request id (and a compile's
its guard hash); the id a client's error names (tcctl's "(request id
...)") leads to exactly the daemon's lines about that call; a sane
client-sent x-request-id is kept, any other replaced; nothing a client
sends (newlines, quotes, invalid UTF-8 in names) breaks a line.
"""
import json
import os
import re

import grpc
import pytest

from conftest import GRAPHS, compile_on, sin_cos_request, tcctl

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")
COMPILE = "/tcc.v1.Compiler/Compile"
TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")
RID = re.compile(r"\(request id ([A-Za-z0-9._-]+)\)")
GENERATED = re.compile(r"^[0-9a-f]{16}$")
LEVELS = {"error", "warn", "info", "debug"}


def json_lines(d):
    """Every line of d's log, each parsed (a line that is not one JSON
    object fails the test)."""
    out = []
    with open(d.log_path, "rb") as f:
        for raw in f.read().splitlines():
            line = json.loads(raw.decode("utf-8"))  # strict: invalid UTF-8 would raise
            assert isinstance(line, dict), raw
            assert TIME.match(line["time"]), line
            assert line["level"] in LEVELS and isinstance(line["msg"], str), line
            out.append(line)
    return out


def lines_of(d, rid):
    return [ln for ln in json_lines(d) if ln.get("request_id") == rid]


def raw_call(addr, payload, metadata=None):
    """A raw Compile: (status code, details, initial metadata, trailing metadata)."""
    with grpc.insecure_channel(addr) as ch:
        fn = ch.unary_unary(COMPILE, request_serializer=None, response_deserializer=None)
        try:
            _, call = fn.with_call(payload, timeout=60, metadata=metadata)
            return grpc.StatusCode.OK, "", dict(call.initial_metadata()), dict(call.trailing_metadata())
        except grpc.RpcError as e:
            return e.code(), e.details(), dict(e.initial_metadata()), dict(e.trailing_metadata())


@pytest.fixture
def token_files(tmp_path):
    tok = "client-token-for-test-logs"
    (tmp_path / "tokens").write_text(f"client {tok}\n")
    (tmp_path / "tokens").chmod(0o600)
    (tmp_path / "client.token").write_text(tok + "\n")
    return str(tmp_path / "tokens"), str(tmp_path / "client.token")


def test_json_log_and_request_ids(daemon_factory, token_files, tmp_path, pb):
    tokens, token = token_files
    d = daemon_factory(extra_args=["--log-format", "json", "--auth-tokens", tokens]).start()
    auth = ("authorization", "Bearer client-token-for-test-logs")

    # a miss, then a hit
    miss = tcctl(d.addr, "--token-file", token, "compile", SIN_COS)
    hit = tcctl(d.addr, "--token-file", token, "compile", SIN_COS)
    assert miss["cache"] == "miss" and hit["cache"] == "hit", (miss, hit)
    guard = miss["guard_hash"]

    # a failing request: a graph that does not verify (INVALID_ARGUMENT)
    bad = tmp_path / "bad.json"
    req = json.load(open(SIN_COS))
    req["graph"]["outputs"] = ["nowhere"]
    bad.write_text(json.dumps(req))
    p = tcctl(d.addr, "--token-file", token, "compile", str(bad), json_out=False, check=False)
    assert p.returncode == 1 and ": INVALID_ARGUMENT: " in p.stderr, p.stderr
    m = RID.search(p.stderr)
    assert m and p.stderr.startswith("tcctl: compile: "), p.stderr
    bad_rid = m.group(1)

    # an auth failure
    p = tcctl(d.addr, "stats", json_out=False, check=False)
    assert p.returncode == 1 and ": UNAUTHENTICATED: " in p.stderr, p.stderr
    auth_rid = RID.search(p.stderr).group(1)

    # a sane client id is kept; insane ones are replaced (and sent back)
    payload = sin_cos_request(pb, 10).SerializeToString()
    code, _, initial, _ = raw_call(d.addr, payload, [auth, ("x-request-id", "job-7.rank_3")])
    assert code == grpc.StatusCode.OK and initial["x-request-id"] == "job-7.rank_3", initial
    replaced = []
    for insane in ("x" * 1000, "has space", "semi;colon"):
        code, _, initial, _ = raw_call(d.addr, payload, [auth, ("x-request-id", insane)])
        assert code == grpc.StatusCode.OK and GENERATED.match(initial["x-request-id"]), initial
        replaced.append(initial["x-request-id"])
    # (control characters cannot travel in gRPC metadata at all; the check
    # is tcc_request_id_valid's: tests/common/test_status.c)

    # a failed call carries the id in its trailing metadata too
    code, details, initial, trailing = raw_call(d.addr, b"\xff\xff", [auth])
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (code, details)
    assert trailing.get("x-request-id") and trailing["x-request-id"] == initial.get("x-request-id", trailing["x-request-id"])
    assert d.stop() == 0

    lines = json_lines(d)
    call_lines = [ln for ln in lines if "request_id" in ln]
    assert all(ln.get("method", "").startswith("/") for ln in call_lines), call_lines
    compile_lines = [ln for ln in call_lines  # about a graph with a guard hash: not one refused unread
                     if ln["msg"].startswith("compile ") and not ln["msg"].startswith("compile rejected")]
    assert compile_lines and all(ln.get("guard_hash") for ln in compile_lines), compile_lines
    # the miss: its compile line has the guard hash, queue and compile times
    done = [ln for ln in compile_lines if ln.get("guard_hash") == guard and "kernel(s)" in ln["msg"]]
    assert len(done) == 1, compile_lines
    assert done[0]["compile_ms"] > 0 and done[0]["queue_ms"] >= 0 and done[0]["duration_ms"] > 0, done
    assert done[0]["client"].startswith("tests/graphs/sin_cos.json"), done
    hits = [ln for ln in compile_lines if ln["msg"].endswith(")") and " hit (" in ln["msg"]]
    assert any(ln["guard_hash"] == guard for ln in hits), compile_lines
    # every call's last line: its status
    ends = [ln for ln in call_lines if "status" in ln]
    assert {"OK", "INVALID_ARGUMENT", "UNAUTHENTICATED"} <= {ln["status"] for ln in ends}, ends

    # the failing request: its id names exactly the lines about it
    mine = lines_of(d, bad_rid)
    assert mine and all("nowhere" in ln["msg"] for ln in mine), mine
    assert sum(bad_rid in json.dumps(ln) for ln in lines) == len(mine)
    assert any(ln["level"] == "info" and ln.get("status") in (None, "INVALID_ARGUMENT") for ln in mine)
    mine = lines_of(d, auth_rid)
    assert mine and any("refused: UNAUTHENTICATED" in ln["msg"] for ln in mine), mine
    assert all(ln["method"] == "/tcc.v1.Cache/Stats" for ln in mine)
    assert lines_of(d, "job-7.rank_3")
    assert all(len(lines_of(d, r)) >= 1 for r in replaced)
    assert not any("x" * 65 in ln.get("request_id", "") for ln in lines)


def test_hostile_strings_keep_lines_json(daemon_factory, pb):
    """Newlines, quotes, backslashes, control and invalid UTF-8 bytes in a
    value name, an op name and the client label reach error messages and
    log lines: each line still parses, and carries them escaped."""
    d = daemon_factory(extra_args=["--log-format", "json"]).start()
    hostile_op = b'aten.\n{"level":"error"}\\\x1b[31m\xff\xfe\xc0\xaf\xed\xa0\x80.x'
    hostile_val = b'v\n"\x00\x7f\xf4\x90\x80\x80'
    hostile_client = b'c\n"\xff\x01\xe2\x82'

    def swap(payload, placeholder, hostile):
        assert len(placeholder) == len(hostile) and payload.count(placeholder) == 1
        return payload.replace(placeholder, hostile)

    # an op name (unknown op) and the client label
    req = sin_cos_request(pb, 10)
    req.graph.nodes[0].target = "O" * len(hostile_op)
    req.client = "C" * len(hostile_client)
    payload = swap(req.SerializeToString(), req.graph.nodes[0].target.encode(), hostile_op)
    payload = swap(payload, req.client.encode(), hostile_client)
    code, details, initial, trailing = raw_call(d.addr, payload)
    assert code != grpc.StatusCode.OK, details
    rid = trailing.get("x-request-id") or initial.get("x-request-id")

    # a value name: a graph input that is no value of the graph
    req = sin_cos_request(pb, 11)
    req.graph.inputs[0] = "V" * len(hostile_val)
    payload = swap(req.SerializeToString(), req.graph.inputs[0].encode(), hostile_val)
    code2, details2, initial2, trailing2 = raw_call(d.addr, payload)
    assert code2 != grpc.StatusCode.OK, details2
    rid2 = trailing2.get("x-request-id") or initial2.get("x-request-id")
    assert d.stop() == 0

    lines = json_lines(d)   # each parses, as UTF-8
    for r in (rid, rid2):
        mine = lines_of(d, r)
        assert mine, (r, lines)
        assert all(ln["level"] != "error" for ln in mine), mine
    assert not any(ln.get("level") == "error" for ln in lines), lines
    text = "\n".join(ln["msg"] + ln.get("client", "") for ln in lines_of(d, rid) + lines_of(d, rid2))
    assert "\ufffd" in text or "\\x" in text, text   # invalid bytes replaced, not passed on
