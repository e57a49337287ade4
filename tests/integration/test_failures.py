"""
Failure classes against the real daemon (issue 19, item 1): a compile
failure is remembered only when the same inputs would fail again.

A fake C compiler (a shell wrapper that answers --version like cc, so the
guard hashes stay those of cc) fails in one way on its first compile and
then works: a compiler killed by a signal, one saying it was killed, out
of memory or disk, a compiler missing for a moment. Each first call gets
UNAVAILABLE or RESOURCE_EXHAUSTED saying it is transient, nothing is put
in the negative cache, and the second call compiles. A compiler
diagnostic is still cached, for --failure-ttl only. A timeout is answered
at once while its backoff lasts, then compiled again. Through Redis a
transient failure is never published, and a deterministic one carries the
compiler identity and lifetime that other daemons check.
"""
import os
import re
import shutil
import time

import grpc
import pytest

from conftest import Redis, compile_on, fake_cc, sin_cos_variant as variant


def once_then_cc(tmp_path, name, failure):
    """A compiler that runs `failure` (shell) on its first compile and is
    cc from then on (a marker file records the first run)."""
    marker = tmp_path / f"{name}.failed-once"
    return fake_cc(tmp_path, name,
                   f'if [ ! -e {marker} ]; then touch {marker}; {failure}; fi\nexec cc "$@"')


def compile_error(d, req, pb):
    with pytest.raises(grpc.RpcError) as e:
        compile_on(d, req, pb)
    return e.value


TRANSIENT = [
    ("oom-killed", 'kill -9 $$', grpc.StatusCode.UNAVAILABLE, "killed by signal 9"),
    ("cc1-killed", 'echo "gcc: fatal error: Killed signal terminated program cc1" >&2; exit 1',
     grpc.StatusCode.UNAVAILABLE, "Killed signal terminated program"),
    ("cc1-oom", 'echo "cc1: out of memory allocating 65536 bytes after a total of 4096 bytes" >&2; exit 1',
     grpc.StatusCode.RESOURCE_EXHAUSTED, "out of memory"),
    ("disk-full", 'echo "/tmp/ccX.s: No space left on device" >&2; exit 1',
     grpc.StatusCode.RESOURCE_EXHAUSTED, "No space left on device"),
    ("cc-missing", 'exec /nonexistent/bin/cc1 "$@"', grpc.StatusCode.UNAVAILABLE, "missing or not executable"),
]


@pytest.mark.parametrize("name,failure,code,words", TRANSIENT, ids=[t[0] for t in TRANSIENT])
def test_transient_failure_is_not_cached(daemon_factory, tmp_path, pb, name, failure, code, words):
    cc = once_then_cc(tmp_path, name, failure)
    d = daemon_factory(extra_args=["--cc", cc]).start()
    req = variant(pb, 11)
    err = compile_error(d, req, pb)
    assert err.code() == code, err.details()
    assert words in err.details() and "transient" in err.details() and "retry" in err.details()
    s = d.stats()
    assert s["compile_failures"] == 1 and s["negative_entries"] == 0
    # the cause is gone: the same request compiles, and so after a restart
    assert compile_on(d, req, pb).cache == pb.MISS
    assert d.stats()["compiles"] == 1
    assert d.stop() == 0


def test_compiler_missing_for_a_moment(daemon_factory, tmp_path, pb):
    """--cc names a file that disappears after start-up, then comes back."""
    cc = fake_cc(tmp_path, "vanishing-cc", 'exec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc]).start()
    os.rename(cc, cc + ".away")
    err = compile_error(d, variant(pb, 12), pb)
    assert err.code() == grpc.StatusCode.UNAVAILABLE and "cannot run" in err.details()
    assert d.stats()["negative_entries"] == 0
    os.rename(cc + ".away", cc)
    assert compile_on(d, variant(pb, 12), pb).cache == pb.MISS
    assert d.stop() == 0


def test_build_dir_unusable_for_a_moment(daemon_factory, tmp_path, pb):
    """A TMPDIR where no build directory can be made (it does not exist:
    UNAVAILABLE; a full one would be RESOURCE_EXHAUSTED) is transient."""
    d = daemon_factory(env={"TMPDIR": str(tmp_path / "no-such-dir")}).start()
    err = compile_error(d, variant(pb, 13), pb)
    assert err.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.RESOURCE_EXHAUSTED), err.details()
    assert "build directory" in err.details() and "transient" in err.details()
    assert d.stats()["negative_entries"] == 0
    (tmp_path / "no-such-dir").mkdir()
    assert compile_on(d, variant(pb, 13), pb).cache == pb.MISS
    assert d.stop() == 0


def test_diagnostic_is_cached_for_the_failure_ttl(daemon_factory, tmp_path, pb):
    cc = fake_cc(tmp_path, "broken-cc", 'echo "kernel.c:1:1: error: expected declaration" >&2; exit 1')
    d = daemon_factory(extra_args=["--cc", cc, "--failure-ttl", "2s"]).start()
    req = variant(pb, 14)
    err = compile_error(d, req, pb)
    assert err.code() == grpc.StatusCode.INTERNAL and "transient" not in err.details()
    assert d.stats()["negative_entries"] == 1
    err = compile_error(d, req, pb)
    assert "recorded failure" in err.details()
    assert d.stats()["compile_failures"] == 1
    time.sleep(3.1)  # past --failure-ttl: compiled (and failing) again
    err = compile_error(d, req, pb)
    assert "recorded failure" not in err.details() and "expected declaration" in err.details()
    assert d.stats()["compile_failures"] == 2
    assert d.stop() == 0


def test_timeout_backs_off_then_retries(daemon_factory, tmp_path, pb):
    """A compile that ran past --compile-timeout-ms is answered
    DEADLINE_EXCEEDED at once for twice the timeout, then compiled again."""
    marker = tmp_path / "hang-once"
    cc = fake_cc(tmp_path, "hang-once-cc", f'if [ ! -e {marker} ]; then touch {marker}; sleep 30; fi\nexec cc "$@"')
    d = daemon_factory(extra_args=["--cc", cc, "--compile-timeout-ms", "700"]).start()
    req = variant(pb, 15)
    t0 = time.time()
    err = compile_error(d, req, pb)
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    t1 = time.time()
    err = compile_error(d, req, pb)
    assert time.time() - t1 < 0.5, "answered from the backoff, without compiling"
    assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "not tried again" in err.details()
    s = d.stats()
    assert s["compile_failures"] == 1 and s["negative_entries"] == 0
    time.sleep(max(0.0, t0 + 0.7 + 1.4 + 0.3 - time.time()))  # the backoff: 2 x 700 ms
    assert compile_on(d, req, pb).cache == pb.MISS
    assert d.stop() == 0


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server not installed")
def test_remote_failure_records(daemon_factory, tmp_path, pb):
    """Through Redis: a transient failure is never published (a second
    daemon with a healthy compiler compiles); a deterministic one is, with
    the compiler identity and --failure-ttl, and a record naming another
    compiler identity is not obeyed."""
    rdir = tmp_path / "redis"
    rdir.mkdir()
    r = Redis(str(rdir)).start()
    try:
        def daemon(name, cc=None):
            wd = tmp_path / f"run-{name}"
            wd.mkdir()
            args = ["--redis", r.url, "--failure-ttl", "1h"] + (["--cc", cc] if cc else [])
            return daemon_factory(cache_dir=str(tmp_path / name), workdir=str(wd), extra_args=args).start()

        flaky = once_then_cc(tmp_path, "flaky-cc", 'kill -9 $$')
        a = daemon("a", flaky)
        err = compile_error(a, variant(pb, 16), pb)
        assert err.code() == grpc.StatusCode.UNAVAILABLE
        assert r.cmd("KEYS", "tccd:*:failure") == []
        b = daemon("b")
        assert compile_on(b, variant(pb, 16), pb).cache in (pb.MISS, pb.REMOTE_HIT)
        assert b.stats()["negative_hits"] == 0

        broken = fake_cc(tmp_path, "broken-cc", 'echo "kernel.c:1:1: error: expected declaration" >&2; exit 1')
        c = daemon("c", broken)
        req = variant(pb, 17)
        err = compile_error(c, req, pb)
        assert err.code() == grpc.StatusCode.INTERNAL
        # the record goes to Redis beside the answer, not before it
        deadline = time.time() + 10
        while not (keys := r.cmd("KEYS", "tccd:*:failure")) and time.time() < deadline:
            time.sleep(0.02)
        assert len(keys) == 1
        fkey = keys[0].decode()
        rec = pb.RemoteFailure.FromString(r.cmd("GET", fkey))
        assert rec.format == 2 and rec.ttl_s == 3600 and rec.compiler_identity.startswith("tccd-codegen/")
        assert 3500 * 1000 < r.cmd("PTTL", fkey) <= 3600 * 1000, "the record lives --failure-ttl"
        identity = rec.compiler_identity

        # the record is obeyed by a daemon of the same compiler identity
        d = daemon("d")
        err = compile_error(d, req, pb)
        assert "shared through the remote tier" in err.details()
        assert d.stats()["compiles"] == 0

        # ... and not when it names another compiler (re-signed by nobody:
        # a fresh daemon with --no-signing --redis-trust-unsigned, which
        # verifies no signature)
        rec.compiler_identity = identity.replace("tccd-codegen/", "tccd-codegen/999-")
        r.cmd("SET", fkey, rec.SerializeToString(), "KEEPTTL")
        wd = tmp_path / "run-e"
        wd.mkdir()
        e = daemon_factory(cache_dir=str(tmp_path / "e"), workdir=str(wd), signing_key=None,
                           extra_args=["--redis", r.url, "--redis-trust-unsigned"]).start()
        assert compile_on(e, req, pb).cache == pb.MISS
        assert "another compiler" in e.read_log()
        for x in (a, b, c, d, e):
            assert x.stop() == 0
    finally:
        r.stop()


def slow_after(tmp_path, name, fast_calls):
    """A compiler that is cc for its first `fast_calls` compiles and then
    hangs (sleep 120): appends each compile's pid to a file, one line each
    (an O_APPEND write of one line is atomic, so concurrent candidate
    builds and a reader never see a half-written count)."""
    count = tmp_path / f"{name}.count"
    return fake_cc(tmp_path, name,
                   f'echo $$ >> {count}; n=$(($(wc -l < {count}) - 1))\n'
                   f'if [ "$n" -ge {fast_calls} ]; then exec sleep 120; fi\nexec cc "$@"')


def compiles_started(tmp_path, name):
    """How many compiles a slow_after compiler has started."""
    count = tmp_path / f"{name}.count"
    return len(count.read_text().split()) if count.exists() else 0


def test_sigterm_kills_running_compiles(daemon_factory, tmp_path, pb):
    """SIGTERM ends within --shutdown-grace-ms + 1 s although a compiler
    hangs: it is killed, its caller gets UNAVAILABLE, nothing is stored
    or recorded, and after a restart the graph compiles."""
    hang = slow_after(tmp_path, "hang-cc", 0)
    d = daemon_factory(extra_args=["--cc", hang, "--shutdown-grace-ms", "1000"]).start()
    req = variant(pb, 18)
    import threading
    out = {}

    def call():
        try:
            compile_on(d, req, pb)
        except grpc.RpcError as e:
            out["err"] = e

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 30
    while not (tmp_path / "hang-cc.count").exists() and time.time() < deadline:
        time.sleep(0.02)
    time.sleep(0.2)
    t0 = time.time()
    assert d.stop() == 0
    took = time.time() - t0
    t.join(30)
    assert took < 1.0 + 1.0 + 0.5, f"SIGTERM took {took:.2f} s with --shutdown-grace-ms 1000"
    assert out["err"].code() == grpc.StatusCode.UNAVAILABLE, out["err"].details()
    assert "shutting down" in out["err"].details()
    d.extra_args = [a for a in d.extra_args if a != hang and a != "--cc"]
    d.start()
    s = d.stats()
    assert s["entries"] == 0 and s["negative_entries"] == 0
    assert compile_on(d, req, pb).cache == pb.MISS
    assert d.stop() == 0


def test_sigterm_during_autotune_stores_nothing(daemon_factory, tmp_path, pb):
    """A max-autotune compile whose tuning run is cut short by SIGTERM
    stores nothing under its key: after the restart it is compiled (and
    tuned) again instead of being a plain hit."""
    # the default build (compile and link: the object cache's two cc runs)
    # is fast; candidate builds (one cc run each) hang
    slow = slow_after(tmp_path, "tune-cc", 2)
    d = daemon_factory(extra_args=["--cc", slow, "--shutdown-grace-ms", "500"]).start()
    req = sin_cos_request_mode(pb, 19, "MAX_AUTOTUNE")
    import threading
    out = {}

    def call():
        try:
            out["resp"] = compile_on(d, req, pb)
        except grpc.RpcError as e:
            out["err"] = e

    t = threading.Thread(target=call)
    t.start()
    deadline = time.time() + 60
    while time.time() < deadline:
        if compiles_started(tmp_path, "tune-cc") >= 3:
            break
        time.sleep(0.02)
    with grpc.insecure_channel(d.addr) as ch:
        raw = ch.unary_unary("/tcc.v1.Compiler/Jobs", request_serializer=None,
                             response_deserializer=None)(pb.JobsRequest().SerializeToString(), timeout=30)
    jobs = pb.JobsResponse.FromString(raw)
    assert [j.state for j in jobs.jobs] == ["AUTOTUNING"], jobs
    t0 = time.time()
    assert d.stop() == 0
    assert time.time() - t0 < 0.5 + 1.0 + 0.5
    t.join(30)
    assert "err" in out and out["err"].code() == grpc.StatusCode.UNAVAILABLE, out
    assert "nothing was stored" in out["err"].details() or "shutting down" in out["err"].details()
    d.extra_args = [a for a in d.extra_args if a != slow and a != "--cc"]
    d.start()
    assert d.stats()["entries"] == 0
    r = compile_on(d, req, pb)
    assert r.cache == pb.MISS, "compiled and tuned again, not a plain hit of an untuned artifact"
    assert d.stop() == 0


def sin_cos_request_mode(pb, rows, mode):
    from conftest import sin_cos_request
    r = sin_cos_request(pb, rows)
    r.options.mode = getattr(pb, mode)
    return r.SerializeToString()


def test_no_signing_with_redis_needs_an_explicit_flag(tmp_path):
    """--no-signing --redis would serve anything written into Redis:
    refused at start, saying which flag says Redis is trusted."""
    import subprocess
    from conftest import TCCD
    extra = ["--allow-root"] if os.geteuid() == 0 else []
    p = subprocess.run([TCCD, *extra, "--no-signing", "--redis", "redis://127.0.0.1:1", "--listen", "127.0.0.1:0",
                        "--cache-dir", str(tmp_path / "c")], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "--redis-trust-unsigned" in p.stderr, p.stderr
