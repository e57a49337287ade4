"""Inference weights read from huge pages.

An inference step with few rows streams every weight from memory (a
decode step, a short sentence): the kernels read hundreds of megabytes a
call at the memory's rate, and on 4 KB pages each 4 KB of weight is a
TLB miss and a page walk. PyTorch's allocator backs tensors with
transparent huge pages only when THP_MEM_ALLOC_ENABLE=1 (and the kernel's
THP mode is "madvise" on Debian and most distributions), so a model's
parameters are usually on 4 KB pages.

On the first call of an inference graph on CPU tensors, the package asks
the kernel to collapse the parameters' memory into 2 MB pages in place
(madvise MADV_COLLAPSE, Linux 6.1 and later): the storage of each
nn.Parameter argument of at least MIN_BYTES, over the 2 MB-aligned part
of it, once per storage. The data and the addresses stay as they are;
nothing is copied that the kernel does not copy itself (about 3 GB/s on
the 2-core VMs of docs/benchmarks.md: 0.1 s for BERT-base's 340 MB,
once). A kernel without MADV_COLLAPSE (EINVAL), or memory it cannot
collapse now (EAGAIN, ENOMEM: no free huge page), leaves the pages as
they are; the first EINVAL turns the collapse off for the process.

Config.huge_pages (TCCD_HUGE_PAGES=0) turns it off. tccd.stats()
counts huge_page_bytes (collapsed) and huge_page_failures.
"""
import ctypes
import errno
import sys
import threading

import torch

from . import _stats

MADV_COLLAPSE = 25
HUGE = 2 << 20
MIN_BYTES = 2 * HUGE      # smaller storages hold at most one huge page's worth
_MAX_SEEN = 1 << 16       # storages remembered (a process that makes models in a loop)

_lock = threading.Lock()
_seen = set()             # storage addresses collapsed or tried
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
    """Collapses the storages of the CPU nn.Parameters among `tensors`
    into huge pages (once each). Returns the bytes collapsed now."""
    global _off
    if _off:
        return 0
    done = failed = 0
    for t in tensors:
        if type(t) is not torch.nn.Parameter or t.device.type != "cpu":
            continue
        st = t.untyped_storage()
        base, n = st.data_ptr(), st.nbytes()
        if n < MIN_BYTES:
            continue
        with _lock:
            if base in _seen:
                continue
            if len(_seen) >= _MAX_SEEN:
                _seen.clear()
            _seen.add(base)
        lo = (base + HUGE - 1) & ~(HUGE - 1)
        hi = (base + n) & ~(HUGE - 1)
        if hi <= lo:
            continue
        if _libc_madvise()(lo, hi - lo, MADV_COLLAPSE) == 0:
            done += hi - lo
            continue
        e = ctypes.get_errno()
        if e == errno.EINVAL:        # no MADV_COLLAPSE in this kernel
            _off = True
            break
        failed += 1
    if done or failed:
        _stats.add(huge_page_bytes=done, huge_page_failures=failed)
    return done
