"""
A full disk is recoverable through the API (issue 19, item 4): the cache
directory lives on a small tmpfs (mounted here; the tests skip where
mounting is not allowed).

- The cache itself fills the disk: a store that fails for lack of space
  evicts (the reserve pays for the deletions) and succeeds; `tcctl gc`
  and `tcctl evict` work on the full disk.
- Something else fills the disk: the store fails even after eviction,
  storing is blocked, misses are refused at once (not compiled and thrown
  away), Stats says why; once space is back the daemon stores again.
"""
import hashlib
import os
import sqlite3
import subprocess
import time

import grpc
import pytest

from conftest import compile_on, sin_cos_variant as variant, wait_for


@pytest.fixture
def small_disk(tmp_path):
    mnt = tmp_path / "disk"
    mnt.mkdir()
    p = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=48m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {p.stderr.strip()}")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def free_bytes(path):
    v = os.statvfs(path)
    return v.f_bavail * v.f_frsize


def fill_disk(path):
    """Appends to a file until the disk has no room left."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for chunk in (1 << 20, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\xa5" * chunk)
            except OSError:
                pass
    finally:
        os.close(fd)


def fill_cache(cache_dir):
    """Copies of the one real entry, each with its own 1 MiB artifact,
    until SQLite says the disk is full. Returns how many fitted."""
    db = sqlite3.connect(os.path.join(cache_dir, "cache.db"))
    row = db.execute("SELECT target, kind, kernels, compile_ms, created, last_used, key, manifest, request_meta "
                     "FROM entries LIMIT 1").fetchone()
    n = 0
    try:
        while True:
            data = os.urandom(1 << 20)
            sha = hashlib.sha256(data).digest()
            db.execute("INSERT INTO blobs(sha256, size, data) VALUES (?, ?, ?)", (sha, len(data), data))
            db.execute("INSERT INTO entries(hash, target, kind, artifact_sha256, size, kernels, compile_ms, created, "
                       "last_used, key, manifest, request_meta) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                       (os.urandom(32), row[0], row[1], sha, len(data), *row[2:]))
            db.commit()
            n += 1
    except sqlite3.OperationalError as e:
        assert "full" in str(e), e
        db.rollback()
    db.close()
    return n


def test_cache_that_fills_the_disk_evicts_and_gc_works(daemon_factory, small_disk, pb):
    cache = str(small_disk / "cache")
    d = daemon_factory(cache_dir=cache, extra_args=["--cache-max-bytes", "0"]).start()
    compile_on(d, variant(pb, 2), pb)
    assert os.path.getsize(os.path.join(cache, "reserve")) == 8 << 20, "the reserve is made at start"
    assert d.stop() == 0
    filled = fill_cache(cache)
    assert filled >= 20 and free_bytes(str(small_disk)) < (1 << 20)
    d.start()
    # a store on the full disk: eviction makes room (the reserve pays for it)
    assert compile_on(d, variant(pb, 3), pb).cache == pb.MISS
    s = d.stats()
    assert s["evictions"] > 0 and not s["store_blocked"], s
    assert "a store failed for lack of space" in d.read_log()
    # fill it again, then free it through the API
    assert d.stop() == 0
    fill_cache(cache)
    d.start()
    out = d.tcctl("gc", "--max-bytes", "4M")
    assert out["evicted"] > 10 and out["freed_bytes"] > (10 << 20), out
    assert d.stats()["bytes"] <= 4 << 20
    wait_for(lambda: os.path.exists(os.path.join(cache, "reserve")), what="the reserve made again")
    assert compile_on(d, variant(pb, 4), pb).cache == pb.MISS
    assert d.stop() == 0


def test_disk_full_of_other_files_blocks_storing_until_space_returns(daemon_factory, small_disk, pb):
    cache = str(small_disk / "cache")
    d = daemon_factory(cache_dir=cache).start()
    compile_on(d, variant(pb, 5), pb)
    filler = small_disk / "filler"
    fill_disk(filler)  # everything but the cache: the disk is full
    os.unlink(os.path.join(cache, "reserve"))  # and someone else takes the reserve's space too
    fill_disk(filler)
    assert free_bytes(str(small_disk)) < 64 << 10
    with pytest.raises(grpc.RpcError) as e:
        compile_on(d, variant(pb, 6), pb)
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, e.value.details()
    s = d.stats()
    assert s["store_blocked"] and "full" in s["store_blocked_reason"], s
    compiles = s["compiles"]
    t0 = time.time()
    with pytest.raises(grpc.RpcError) as e:
        compile_on(d, variant(pb, 7), pb)
    assert time.time() - t0 < 0.5
    assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "does not compile what it would throw away" in e.value.details()
    assert d.stats()["compiles"] == compiles, "a blocked daemon does not compile"
    assert compile_on(d, variant(pb, 5), pb).cache == pb.HIT, "hits are still served"
    os.unlink(filler)
    wait_for(lambda: not d.stats()["store_blocked"], timeout=10, what="storing unblocked")
    assert compile_on(d, variant(pb, 7), pb).cache == pb.MISS
    assert d.stop() == 0
