"""ctypes binding of libtccclient's byte-level API (client/tccclient.h, ffi.c).

The library is found, in order, at:
  1. $TCCD_CLIENT_LIB (a path to libtccclient.so);
  2. <repository>/build/client/libtccclient.so, relative to this package's
     source (an editable install from a checkout);
  3. the system loader path (`libtccclient.so`, ctypes.util.find_library).

Only the functions declared here are used; every one returns 0 or a
negative TCC_E_* code and fills an opaque tcc_error (tcc_error_new/...).
Buffers the library returns are released with tcc_free. ctypes drops the
GIL during every call, so compiles from several threads run concurrently.
"""
import ctypes
import ctypes.util
import os
import threading

from .errors import TccdLibraryError

_c_void_pp = ctypes.POINTER(ctypes.c_void_p)
_c_u8_p = ctypes.POINTER(ctypes.c_uint8)
_c_u8_pp = ctypes.POINTER(_c_u8_p)
_c_size_p = ctypes.POINTER(ctypes.c_size_t)

# name -> (restype, argtypes)
_PROTOTYPES = {
    "tcc_client_open": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_char_p, _c_void_pp, ctypes.c_void_p]),
    "tcc_client_close": (None, [ctypes.c_void_p]),
    "tcc_client_addr_check": (ctypes.c_int, [ctypes.c_char_p, ctypes.c_void_p]),
    "tcc_client_addr": (ctypes.c_char_p, [ctypes.c_void_p]),
    "tcc_client_call": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p,
                                       ctypes.c_size_t, _c_u8_pp, _c_size_p, ctypes.c_int,
                                       ctypes.c_void_p]),
    "tcc_client_compile_bytes": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                                _c_u8_pp, _c_size_p, ctypes.c_void_p]),
    "tcc_client_get_module_bytes": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                                   ctypes.c_size_t, _c_void_pp, _c_u8_pp,
                                                   _c_size_p, ctypes.c_void_p]),
    "tcc_client_health": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p,
                                         ctypes.POINTER(ctypes.c_int), ctypes.c_void_p]),
    "tcc_client_get_plan_bytes": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, _c_u8_pp,
                                                 _c_size_p, ctypes.POINTER(ctypes.c_int),
                                                 ctypes.c_void_p]),
    "tcc_client_put_plan_bytes": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                                 ctypes.POINTER(ctypes.c_int), ctypes.c_void_p]),
    "tcc_module_run": (ctypes.c_int, [ctypes.c_void_p, _c_void_pp, _c_void_pp, ctypes.c_void_p,
                                      ctypes.c_void_p]),
    "tcc_module_symbols": (ctypes.c_int, [ctypes.c_void_p]),
    "tcc_module_bind": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                                       ctypes.POINTER(ctypes.c_int64),
                                       ctypes.POINTER(ctypes.c_int64),
                                       ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]),
    "tcc_module_output_layout": (ctypes.c_int, [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                                                ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                                ctypes.POINTER(ctypes.c_int64), ctypes.c_void_p]),
    "tcc_module_workspace_bytes": (ctypes.c_int64, [ctypes.c_void_p,
                                                    ctypes.POINTER(ctypes.c_int64)]),
    "tcc_module_run_sym": (ctypes.c_int, [ctypes.c_void_p, _c_void_pp, _c_void_pp,
                                          ctypes.c_void_p, ctypes.POINTER(ctypes.c_int64),
                                          ctypes.c_void_p]),
    "tcc_module_manifest_bytes": (ctypes.c_int, [ctypes.c_void_p, _c_u8_pp, _c_size_p,
                                                 ctypes.c_void_p]),
    "tcc_module_unload": (None, [ctypes.c_void_p]),
    "tcc_module_cuda": (ctypes.c_void_p, [ctypes.c_void_p]),
    "tcc_rt_cuda_kernel_launch": (ctypes.c_int, [ctypes.c_void_p, ctypes.c_void_p, _c_void_pp,
                                              _c_void_pp, ctypes.c_void_p, ctypes.c_void_p]),
    "tcc_rt_cuda_kernel_set_graphs": (None, [ctypes.c_void_p, ctypes.c_int]),
    "tcc_rt_cuda_kernel_workspace_bytes": (ctypes.c_uint64, [ctypes.c_void_p]),
    "tcc_rt_cuda_kernel_stats": (None, [ctypes.c_void_p, ctypes.c_void_p]),
    "tcc_rt_cuda_device_arch": (ctypes.c_int, [ctypes.c_int, ctypes.c_char_p, ctypes.c_char_p,
                                            ctypes.c_size_t, ctypes.c_void_p]),
    "tcc_free": (None, [ctypes.c_void_p]),
    "tcc_error_new": (ctypes.c_void_p, []),
    "tcc_error_code": (ctypes.c_int, [ctypes.c_void_p]),
    "tcc_error_message": (ctypes.c_char_p, [ctypes.c_void_p]),
    "tcc_error_request_id": (ctypes.c_char_p, [ctypes.c_void_p]),
    "tcc_error_free": (None, [ctypes.c_void_p]),
    "tcc_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "tcc_client_version": (ctypes.c_char_p, []),
}

_lock = threading.Lock()
_lib = None
_lib_path = None


def candidate_paths():
    """Where the library is looked for, in order (a generator: the system
    search, ctypes.util.find_library, runs ldconfig -- 22 ms of a warm
    start -- so it is asked only when the earlier places fail)."""
    env = os.environ.get("TCCD_CLIENT_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.normpath(os.path.join(here, "..", "..", ".."))
    yield os.path.join(repo, "build", "client", "libtccclient.so")
    yield ctypes.util.find_library("tccclient") or "libtccclient.so"


def load():
    """The loaded library (loaded once per process). Raises TccdLibraryError."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = []
        env = os.environ.get("TCCD_CLIENT_LIB")
        for i, path in enumerate(candidate_paths()):
            is_file = os.sep in path
            if is_file and not os.path.exists(path):
                tried.append(f"{path} (missing)")
                if i == 0 and env:
                    # An explicit TCCD_CLIENT_LIB that does not exist is an error,
                    # not a reason to pick up some other build.
                    break
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError as e:
                tried.append(f"{path} ({e})")
                if i == 0 and env:
                    break
                continue
            for name, (res, args) in _PROTOTYPES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError:
                    raise TccdLibraryError(f"{path} lacks {name}: an older libtccclient?",
                                           status="LIBRARY") from None
                fn.restype = res
                fn.argtypes = args
            _lib, _lib_path = lib, path
            return lib
        raise TccdLibraryError("cannot load libtccclient: tried " + "; ".join(tried) +
                               " (set TCCD_CLIENT_LIB to the library's path)", status="LIBRARY")


def path():
    """The path the library was loaded from (loads it)."""
    load()
    return _lib_path


class Error:
    """An owned tcc_error* (tcc_error_new / tcc_error_free)."""

    __slots__ = ("ptr", "_free")

    def __init__(self):
        lib = load()
        self.ptr = lib.tcc_error_new()
        if not self.ptr:
            raise MemoryError("tcc_error_new")
        self._free = lib.tcc_error_free

    @property
    def message(self):
        m = load().tcc_error_message(self.ptr)
        return m.decode("utf-8", "replace") if m else ""

    @property
    def request_id(self):
        """The daemon's id of the call that failed, or None."""
        r = load().tcc_error_request_id(self.ptr)
        return r.decode("ascii", "replace") if r else None

    def __del__(self):
        if self.ptr:
            self._free(self.ptr)
            self.ptr = None


_tls = threading.local()


def thread_error():
    """A tcc_error owned by the calling thread, reused by hot paths."""
    e = getattr(_tls, "err", None)
    if e is None:
        e = _tls.err = Error()
    return e


_run_addresses = None


def run_by_address():
    """tcc_module_run with every argument a plain address (an int or None):
    the pointer arrays are the caller's, reused from call to call, so that
    a steady call builds no ctypes objects (a typed call that checks two
    array arguments cost 0.9 us against 0.5; scripts/bench-overhead)."""
    global _run_addresses
    if _run_addresses is None:
        proto = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * 5)
        _run_addresses = proto(ctypes.cast(load().tcc_module_run, ctypes.c_void_p).value)
    return _run_addresses


def take_bytes(buf, n):
    """Copies a library-owned buffer into bytes and frees it."""
    lib = load()
    try:
        return ctypes.string_at(buf, n.value) if buf else b""
    finally:
        if buf:
            lib.tcc_free(buf)
