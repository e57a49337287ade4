"""
--metrics-listen: the Prometheus page at GET /metrics. Its counters and
gauges agree with `tcctl stats --json`, the histograms count what the
counters count (hits, compiles, queued jobs), calls are counted by method
and status code; the port takes the gRPC port's bearer tokens and TLS
certificate; slow or hostile clients do not stall a Compile; a taken port
stops the daemon at start with one clear line.
"""
import http.client
import os
import secrets
import socket
import ssl
import subprocess
import threading
import time

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import TCCD, compile_on, free_port, sin_cos_variant

# StatsResponse field -> metric (docs/operations.md#metrics has the table).
STATS_METRICS = {
    "entries": "tccd_cache_entries", "bytes": "tccd_cache_bytes", "max_bytes": "tccd_cache_max_bytes",
    "hits": "tccd_cache_hits_total", "misses": "tccd_cache_misses_total",
    "coalesced": "tccd_cache_coalesced_total", "compiles": "tccd_compiles_total",
    "compile_failures": "tccd_compile_failures_total", "compile_seconds": "tccd_compile_seconds_total",
    "compile_seconds_saved": "tccd_compile_seconds_saved_total", "evictions": "tccd_cache_evictions_total",
    "corrupt_blobs": "tccd_cache_corrupt_blobs_total", "corrupt_entries": "tccd_cache_corrupt_entries_total",
    "requests": "tccd_compile_requests_total", "invalid_requests": "tccd_compile_invalid_requests_total",
    "rejected_memory": "tccd_rejected_memory_total", "negative_hits": "tccd_negative_hits_total",
    "negative_entries": "tccd_negative_entries", "auth_failures": "tccd_auth_failures_total",
    "queue_depth": "tccd_queue_depth", "running_jobs": "tccd_running_jobs",
    "autotuning_jobs": "tccd_autotuning_jobs", "workers": "tccd_workers", "uptime_seconds": "tccd_uptime_seconds",
    "store_blocked": "tccd_store_blocked", "remote_enabled": "tccd_remote_enabled",
    "remote_connected": "tccd_remote_connected", "remote_hits": "tccd_remote_hits_total",
    "remote_errors": "tccd_remote_errors_total", "remote_stores": "tccd_remote_stores_total",
    "remote_lock_waits": "tccd_remote_lock_waits_total", "remote_rejected": "tccd_remote_rejected_total",
    "autotune_runs": "tccd_autotune_runs_total", "autotune_candidates": "tccd_autotune_candidates_total",
    "autotune_discarded": "tccd_autotune_discarded_total", "autotune_crashed": "tccd_autotune_crashed_total",
    "autotune_timeouts": "tccd_autotune_timeouts_total", "autotune_wrong": "tccd_autotune_wrong_total",
    "autotune_seconds": "tccd_autotune_seconds_total", "autotune_record_hits": "tccd_autotune_record_hits_total",
    "autotune_remote_record_hits": "tccd_autotune_remote_record_hits_total",
    "autotune_untuned": "tccd_autotune_untuned_total", "tuning_records": "tccd_tuning_records",
    "object_hits": "tccd_object_hits_total", "object_misses": "tccd_object_misses_total",
    "plans": "tccd_plans", "plan_bytes": "tccd_plan_bytes", "plan_hits": "tccd_plan_hits_total",
    "plan_misses": "tccd_plan_misses_total", "plans_stored": "tccd_plans_stored_total",
}
# strings (the version is tccd_build_info's label), and tcctl's own ratio
NOT_METRICS = {"version", "remote_address", "signing_key_id", "store_blocked_reason", "hit_rate",
               "warnings"}  # text: on health and stats (tcctl); the conditions have gauges (store_blocked)
HISTOGRAMS = ("tccd_cache_hit_seconds", "tccd_compile_duration_seconds", "tccd_queue_wait_seconds")


def metrics_daemon(daemon_factory, *args):
    port = free_port()
    d = daemon_factory(extra_args=["--metrics-listen", f"127.0.0.1:{port}", *args]).start()
    d.metrics_port = port
    return d


def scrape(d, method="GET", path="/metrics", token=None, context=None):
    """(status, headers, body) of one request to the metrics port."""
    if context:
        conn = http.client.HTTPSConnection("127.0.0.1", d.metrics_port, timeout=30, context=context)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", d.metrics_port, timeout=30)
    conn.request(method, path, headers={"Authorization": f"Bearer {token}"} if token else {})
    r = conn.getresponse()
    body = r.read().decode()
    conn.close()
    return r.status, r.headers, body


def samples(text):
    """{(sample name, frozenset(labels)): value} of a page, which must parse."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(page, name, **labels):
    return page[(name, frozenset(labels.items()))]


def test_page_matches_stats(daemon_factory, pb):
    d = metrics_daemon(daemon_factory)
    payload = sin_cos_variant(pb, 7)
    assert compile_on(d, payload, pb).cache == pb.MISS
    for _ in range(2):
        assert compile_on(d, payload, pb).cache == pb.HIT
    with grpc.insecure_channel(d.addr) as ch, pytest.raises(grpc.RpcError) as e:
        ch.unary_unary("/tcc.v1.Compiler/Compile", request_serializer=None,
                       response_deserializer=None)(b"\xff\xff garbage", timeout=30)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    stats = d.stats()
    status, headers, body = scrape(d)
    assert status == 200, body
    assert headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    page = samples(body)

    # every number Stats carries, under its Prometheus name
    numeric = {k for k, v in stats.items() if k not in NOT_METRICS}
    assert numeric == set(STATS_METRICS), numeric ^ set(STATS_METRICS)
    for field, name in STATS_METRICS.items():
        got = value(page, name)
        if field == "uptime_seconds":
            assert abs(got - stats[field]) <= 2
        else:
            assert got == pytest.approx(float(stats[field])), (field, name)
    assert stats["hits"] == 2 and stats["misses"] == 1 and stats["compiles"] == 1
    assert value(page, "tccd_build_info", version=stats["version"]) == 1

    # the histograms count what the counters count
    assert value(page, "tccd_cache_hit_seconds_count") == stats["hits"]
    assert value(page, "tccd_compile_duration_seconds_count") == stats["compiles"]
    assert value(page, "tccd_queue_wait_seconds_count") == stats["misses"]
    assert value(page, "tccd_compile_duration_seconds_sum") == pytest.approx(stats["compile_seconds"], rel=1e-6)
    for h in HISTOGRAMS:
        buckets = sorted(((float(dict(labels)["le"]), v) for (n, labels), v in page.items()
                          if n == h + "_bucket"))
        assert buckets[-1] == (float("inf"), value(page, h + "_count"))
        assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:])), buckets  # cumulative
        assert value(page, h + "_sum") >= 0

    # finished calls by method and status
    assert value(page, "tccd_requests_total", method="Compile", code="OK") == 3
    assert value(page, "tccd_requests_total", method="Compile", code="INVALID_ARGUMENT") == 1
    assert value(page, "tccd_requests_total", method="Stats", code="OK") == 1
    d.tcctl("show", "0" * 64, check=False)
    page = samples(scrape(d)[2])
    assert value(page, "tccd_requests_total", method="Show", code="NOT_FOUND") == 1

    # HEAD: the headers only; other paths and methods
    status, headers, body = scrape(d, method="HEAD")
    assert status == 200 and body == "" and int(headers["Content-Length"]) > 1000
    assert scrape(d, path="/")[0] == 404
    assert scrape(d, path="/metrics?x=1")[0] == 200
    status, headers, _ = scrape(d, method="POST")
    assert status == 405 and headers["Allow"] == "GET, HEAD"
    assert d.stop() == 0


@pytest.fixture
def tokens(tmp_path):
    t = {"client": secrets.token_hex(24), "admin": secrets.token_hex(24)}
    path = tmp_path / "tokens"
    path.write_text(f"client {t['client']}\nadmin {t['admin']}\n")
    path.chmod(0o600)
    return str(path), t


def test_auth(daemon_factory, tokens):
    path, t = tokens
    d = metrics_daemon(daemon_factory, "--auth-tokens", path)
    status, headers, body = scrape(d)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer"), body
    assert "bearer token" in body
    assert scrape(d, token="x" * 32)[0] == 401
    assert scrape(d, path="/elsewhere")[0] == 401  # nothing but 401 without a token
    for role in ("client", "admin"):
        status, _, body = scrape(d, token=t[role])
        assert status == 200, body
    page = samples(body)
    assert value(page, "tccd_auth_failures_total") == 3
    log = d.read_log()
    assert t["client"] not in log and t["admin"] not in log
    assert d.stop() == 0


def test_tls(daemon_factory, tokens, tmp_path):
    if subprocess.run(["which", "openssl"], capture_output=True).returncode != 0:
        pytest.skip("openssl CLI not installed")
    from test_tls import make_ca, make_cert  # the CA and server certificate of the TLS test

    pki = str(tmp_path)
    ca = make_ca(pki, "ca")
    cert, key = make_cert(pki, "server", "ca", "serverAuth")
    path, t = tokens
    d = metrics_daemon(daemon_factory, "--tls-cert", cert, "--tls-key", key, "--auth-tokens", path)
    assert "metrics on https://" in d.read_log()
    ctx = ssl.create_default_context(cafile=ca)
    status, _, body = scrape(d, token=t["client"], context=ctx)
    assert status == 200 and "tccd_cache_hits_total" in body
    assert scrape(d, context=ctx)[0] == 401
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
        scrape(d, token=t["client"])  # plain HTTP to the HTTPS port
    with pytest.raises(ssl.SSLError):  # a client that does not trust the CA
        scrape(d, token=t["client"], context=ssl.create_default_context())
    assert scrape(d, token=t["client"], context=ctx)[0] == 200  # still serving
    assert d.stop() == 0

    # mutual TLS: a client certificate from --tls-client-ca, as on the gRPC port
    client_cert, client_key = make_cert(pki, "client", "ca", "clientAuth")
    d = metrics_daemon(daemon_factory, "--tls-cert", cert, "--tls-key", key, "--tls-client-ca", ca)
    with pytest.raises((ssl.SSLError, ConnectionError, http.client.HTTPException, OSError)):
        scrape(d, context=ctx)
    ctx.load_cert_chain(client_cert, client_key)
    assert scrape(d, context=ctx)[0] == 200
    assert d.stop() == 0


def test_slow_and_hostile_clients_do_not_stall_the_loop(daemon_factory, pb):
    d = metrics_daemon(daemon_factory)
    idle = [socket.create_connection(("127.0.0.1", d.metrics_port)) for _ in range(4)]
    partial = socket.create_connection(("127.0.0.1", d.metrics_port))
    partial.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # and never the end
    flood_result = {}

    def flood():
        s = socket.create_connection(("127.0.0.1", d.metrics_port))
        try:
            s.sendall(b"GET /metrics HTTP/1.1\r\nX-Junk: " + b"a" * 100_000 + b"\r\n\r\n")
        except OSError:
            pass  # the daemon may answer and close before it has read it all
        try:
            flood_result["reply"] = s.recv(200)
        except OSError as e:
            flood_result["reply"] = repr(e).encode()
        s.close()

    th = threading.Thread(target=flood)
    th.start()
    t0 = time.monotonic()
    assert compile_on(d, sin_cos_variant(pb, 11), pb, timeout=60).cache == pb.MISS
    for _ in range(20):
        assert compile_on(d, sin_cos_variant(pb, 11), pb, timeout=5).cache == pb.HIT
    elapsed = time.monotonic() - t0
    assert scrape(d)[0] == 200  # a scrape gets through beside them
    th.join(30)
    assert not th.is_alive()
    # 431, unless the close with unread bytes reset the connection first
    reply = flood_result["reply"]
    assert reply.startswith(b"HTTP/1.1 431") or b"ConnectionReset" in reply or reply == b"", reply
    assert elapsed < 30, elapsed
    page = samples(scrape(d)[2])
    assert value(page, "tccd_cache_hit_seconds_count") == 20
    # silent clients are cut off after the read timeout (10 s)
    for s in idle + [partial]:
        s.settimeout(20)
        assert s.recv(100) == b""
        s.close()
    assert d.stop() == 0


def test_port_taken_is_a_clear_start_error(tmp_path):
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen(1)
    port = taken.getsockname()[1]
    base = [TCCD, "--listen", "127.0.0.1:0", "--cache-dir", str(tmp_path / "cache"), "--no-signing"]
    base += ["--allow-root"] if os.geteuid() == 0 else []
    p = subprocess.run(base + ["--metrics-listen", f"127.0.0.1:{port}"], capture_output=True, text=True,
                       timeout=60)
    taken.close()
    assert p.returncode == 1, p.stderr  # as a taken --listen port
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, p.stderr
    assert f"cannot listen on 127.0.0.1:{port} (--metrics-listen): address already in use" in lines[0]

    p = subprocess.run(base + ["--metrics-listen", "nonsense"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--metrics-listen expects HOST:PORT" in p.stderr, p.stderr
