"""Inference weights read from huge pages.

An inference step with few rows streams every weight from memory (a
decode step, a short sentence): the kernels read hundreds of megabytes a
call at the memory's rate, and on 4 KB pages each 4 KB of weight is a
TLB miss and a page walk. PyTorch's allocator backs tensors with
transparent huge pages only when THP_MEM_ALLOC_ENABLE=1 (and the kernel's
THP mode is "madvise" on Debian and most distributions), so a model's
parameters are usually on 4 KB pages.

After the first call of an inference graph on CPU tensors, the package asks
the kernel to collapse the parameters' memory into 2 MB pages in place
(madvise MADV_COLLAPSE, Linux 6.1 and later): the storage of each
nn.Parameter argument of at least MIN_BYTES, over the 2 MB-aligned part
of it, once per storage. The data and the addresses stay as they are.
The collapse runs on a thread of its own, one 2 MB page at a time, so no
call waits for it: the kernel copies each page, at 0.3-0.4 GB/s on the
2-core VMs of docs/benchmarks.md (BERT-base's 340 MB in 0.7 s, a
1B-class decoder's 1.2 GB in 3.2 s), and calls meanwhile read the
weights as they were. It starts once the first call has returned: it
takes the page tables' lock, and the first call's page faults (new
outputs, loaded kernels) had waited behind it, 0.4-0.6 s on BERT-base. A kernel without MADV_COLLAPSE (EINVAL) turns the
collapse off for the process; memory it cannot collapse now (EAGAIN,
ENOMEM: no free huge page) stays on small pages.

Config.huge_pages (TCCD_HUGE_PAGES=0) turns it off. tccd.stats()
counts huge_page_bytes (collapsed), huge_page_failures and
huge_page_seconds (the thread's time); wait() returns once the thread
has nothing left (benchmarks, tests).
"""
import collections
import ctypes
import errno
import os
import sys
import threading
import time

import torch

from . import _stats

MADV_COLLAPSE = 25
HUGE = 2 << 20
MIN_BYTES = 2 * HUGE      # smaller storages hold at most one huge page's worth
_MAX_SEEN = 1 << 16       # storages remembered (a process that makes models in a loop)

_cv = threading.Condition()
_seen = set()             # storage addresses queued or collapsed
_queue = collections.deque()   # (lo, hi): 2 MB-aligned ranges left
_busy = False             # the thread is collapsing a page
_thread = None
_madvise = None
_off = sys.platform != "linux"


def _libc_madvise():
    global _madvise
    if _madvise is None:
        libc = ctypes.CDLL(None, use_errno=True)
        f = libc.madvise
        f.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        f.restype = ctypes.c_int
        _madvise = f
    return _madvise


def collapse(tensors):
    """Queues the storages of the CPU nn.Parameters among `tensors` (once
    each) for the collapsing thread. Returns the bytes queued."""
    if _off:
        return 0
    queued = 0
    with _cv:
        for t in tensors:
            if type(t) is not torch.nn.Parameter or t.device.type != "cpu":
                continue
            st = t.untyped_storage()
            base, n = st.data_ptr(), st.nbytes()
            if n < MIN_BYTES or base in _seen:
                continue
            if len(_seen) >= _MAX_SEEN:
                _seen.clear()
            _seen.add(base)
            lo, hi = (base + HUGE - 1) & ~(HUGE - 1), (base + n) & ~(HUGE - 1)
            if hi > lo:
                _queue.append((lo, hi))
                queued += hi - lo
        if queued:
            _start()
            _cv.notify_all()
    return queued


def wait(timeout=None):
    """Waits until every queued storage is collapsed (or given up);
    returns False on timeout."""
    end = None if timeout is None else time.monotonic() + timeout
    with _cv:
        while _queue or _busy:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return False
            _cv.wait(left)
    return True


def _start():
    global _thread
    if _thread is None or not _thread.is_alive():
        _thread = threading.Thread(target=_run, name="tccd-hugepages", daemon=True)
        _thread.start()


def _run():
    global _busy, _off
    madvise = _libc_madvise()
    while True:
        with _cv:
            while not _queue:
                _busy = False
                _cv.notify_all()
                _cv.wait()
            lo, hi = _queue.popleft()
            if hi - lo > HUGE:
                _queue.appendleft((lo + HUGE, hi))
            _busy = True
        t0 = time.perf_counter()
        rc = madvise(lo, HUGE, MADV_COLLAPSE)     # the GIL is let go meanwhile
        e = ctypes.get_errno() if rc else 0
        dt = time.perf_counter() - t0
        if e == errno.EINVAL:                     # no MADV_COLLAPSE in this kernel
            with _cv:
                _off = True
                _queue.clear()
            _stats.add(huge_page_seconds=dt)
            continue
        _stats.add(huge_page_bytes=0 if rc else HUGE, huge_page_failures=1 if rc else 0, huge_page_seconds=dt)


def _after_fork_in_child():
    # the thread is not in the child; its queue goes with it
    global _thread, _busy, _cv
    _cv = threading.Condition()
    _queue.clear()
    _busy = False
    _thread = None


os.register_at_fork(after_in_child=_after_fork_in_child)
