"""
Signed artifacts: the daemon signs (guard hash, artifact digest, manifest)
with its --signing-key; libtccclient (tcctl, tcc-run) with trusted keys
refuses anything unsigned, signed by another key, or altered on the way
(in the daemon's SQLite file) before it loads it; without trusted keys it
still checks digests. A daemon that signs never serves an entry it did not
sign (one from a --no-signing run is compiled again).
"""
import os
import sqlite3
import subprocess

import numpy as np
import pytest

from conftest import GRAPHS, TCC_RUN, TCCTL, keygen, tcctl

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")
COMPILE = "/tcc.v1.Compiler/Compile"


def run_graph(addr, tmp_path, trusted=None):
    """sin_cos through tcc-run (compile, verify, fetch, dlopen, run) on fresh
    random inputs; returns the CompletedProcess and, on success, checks the
    result against float64 NumPy."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((10, 10)) * 3).astype(np.float32)
    y = (rng.standard_normal((10, 10)) * 3).astype(np.float32)
    (tmp_path / "x.bin").write_bytes(x.tobytes())
    (tmp_path / "y.bin").write_bytes(y.tobytes())
    out = tmp_path / "out.bin"
    if out.exists():
        out.unlink()
    env = dict(os.environ)
    env.pop("TCCD_TRUSTED_KEYS", None)
    if trusted:
        env["TCCD_TRUSTED_KEYS"] = trusted
    p = subprocess.run([TCC_RUN, addr, SIN_COS, str(tmp_path / "x.bin"), str(tmp_path / "y.bin"), "--",
                        str(out)], capture_output=True, text=True, timeout=300, env=env)
    if p.returncode == 0:
        got = np.fromfile(out, dtype=np.float32).reshape(10, 10)
        want = np.sin(x.astype(np.float64)) + np.cos(y.astype(np.float64))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"seed {seed}")
    else:
        assert not out.exists(), "nothing may be written when the artifact is refused"
    return p


def db_exec(cache_dir, sql, *params):
    db = sqlite3.connect(os.path.join(cache_dir, "cache.db"))
    try:
        cur = db.execute(sql, params)
        rows = cur.fetchall()
        db.commit()
        return rows
    finally:
        db.close()


def test_compile_response_is_signed_and_verifies(daemon_factory, signing_key, tmp_path):
    d = daemon_factory().start()
    pub = signing_key + ".pub"
    key_id = open(pub).read().split()[2]
    r = d.tcctl("compile", SIN_COS, "--trusted-keys", pub)
    assert r["cache"] == "miss" and r["key_id"] == key_id and r["signature_verified"] is True
    hit = d.tcctl("compile", SIN_COS, "--trusted-keys", pub)
    assert hit["cache"] == "hit" and hit["signature_verified"] is True
    assert d.stats()["signing_key_id"] == key_id
    assert [e["key_id"] for e in d.tcctl("ls")["entries"]] == [key_id]
    # the human form says so too
    out = d.tcctl("compile", SIN_COS, "--trusted-keys", pub, json_out=False)
    assert f"key {key_id}, verified" in out
    # tcc-run (libtccclient's get_kernel) verifies, loads and runs it
    p = run_graph(d.addr, tmp_path, trusted=pub)
    assert p.returncode == 0, p.stderr

    # another key is not trusted: refused before anything is loaded
    other = keygen(tmp_path / "other.key") + ".pub"
    p = tcctl(d.addr, "compile", SIN_COS, "--trusted-keys", other, check=False)
    assert p.returncode == 1
    assert "PERMISSION_DENIED: artifact signature invalid" in p.stderr and key_id in p.stderr
    p = run_graph(d.addr, tmp_path, trusted=other)
    assert p.returncode != 0 and "artifact signature invalid" in p.stderr
    # several trusted keys (a rotation): the one named by key_id is used
    assert d.tcctl("compile", SIN_COS, "--trusted-keys", f"{other},{pub}")["signature_verified"]
    # a missing trusted key file is an error, not "no keys"
    p = tcctl(d.addr, "compile", SIN_COS, "--trusted-keys", str(tmp_path / "nope.pub"), check=False)
    assert p.returncode == 1 and "nope.pub" in p.stderr
    assert d.stop() == 0


def test_no_signing_daemon_is_refused_by_clients_with_trusted_keys(daemon_factory, signing_key, tmp_path):
    d = daemon_factory(signing_key=None).start()
    assert "--no-signing" in d.read_log()
    r = d.tcctl("compile", SIN_COS)
    assert r["key_id"] == "" and r["signature_verified"] is False
    assert "unsigned" in d.tcctl("compile", SIN_COS, json_out=False)
    assert d.stats()["signing_key_id"] == ""
    # without trusted keys the unsigned artifact loads (digest still checked)
    assert run_graph(d.addr, tmp_path).returncode == 0
    # with them it is refused, saying why
    p = run_graph(d.addr, tmp_path, trusted=signing_key + ".pub")
    assert p.returncode != 0
    assert "PERMISSION_DENIED" in p.stderr
    assert "artifact is unsigned and TCCD_TRUSTED_KEYS is set" in p.stderr
    assert d.stop() == 0


def test_signing_daemon_recompiles_unsigned_entries(daemon_factory, signing_key, cache_dir):
    d = daemon_factory(signing_key=None).start()
    assert d.tcctl("compile", SIN_COS)["cache"] == "miss"
    assert d.stop() == 0
    d2 = daemon_factory(cache_dir=cache_dir).start()  # same cache, now signing
    pub = signing_key + ".pub"
    r = d2.tcctl("compile", SIN_COS, "--trusted-keys", pub)
    assert r["cache"] == "miss" and r["signature_verified"], "an unsigned entry is not served"
    assert d2.tcctl("compile", SIN_COS, "--trusted-keys", pub)["cache"] == "hit"
    assert d2.stats()["compiles"] == 2
    assert d2.stop() == 0


def test_altered_entry_in_sqlite_is_refused(daemon_factory, signing_key, cache_dir, tmp_path):
    """The daemon verifies an entry (signature, then the artifact's
    digest) before it first answers it HIT: an entry altered in cache.db is
    removed and compiled again in the same call, so the client gets a
    fresh, correctly signed artifact (MISS) and runs it."""
    pub = signing_key + ".pub"
    d = daemon_factory().start()
    first = d.tcctl("compile", SIN_COS)
    assert d.stop() == 0

    def recompiled(log_words):
        d.start()
        r = d.tcctl("compile", SIN_COS, "--trusted-keys", pub)
        assert r["cache"] == "miss" and r["signature_verified"], r
        # compiled again: the same kernels, though not always the same bytes
        # (this build links its bodies from the object cache the first stored)
        assert r["guard_hash"] == first["guard_hash"] and r["kernels"] == first["kernels"]
        assert log_words in d.read_log()
        assert run_graph(d.addr, tmp_path, trusted=pub).returncode == 0
        assert d.tcctl("compile", SIN_COS, "--trusted-keys", pub)["cache"] == "hit"
        assert d.stop() == 0

    # 1. the manifest altered in place (the entry points at another target)
    manifest = db_exec(cache_dir, "SELECT manifest FROM entries")[0][0]
    assert b"x86-64-v2" in manifest
    db_exec(cache_dir, "UPDATE entries SET manifest = ?", manifest.replace(b"x86-64-v2", b"x86-64-v3"))
    recompiled("artifact signature invalid")

    # 2. the signature itself altered
    sig = bytearray(db_exec(cache_dir, "SELECT signature FROM entries")[0][0])
    assert len(sig) == 64
    sig[17] ^= 0x40
    db_exec(cache_dir, "UPDATE entries SET signature = ?", bytes(sig))
    recompiled("fails verification")

    # 3. a byte of the artifact flipped: the digest check drops the blob
    blob = bytearray(db_exec(cache_dir, "SELECT data FROM blobs")[0][0])
    blob[len(blob) // 2] ^= 0x01
    db_exec(cache_dir, "UPDATE blobs SET data = ?", bytes(blob))
    recompiled("is corrupt")
