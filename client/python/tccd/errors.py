"""Exceptions of the tccd package.

Every failure that comes from tccd or libtccclient is a `TccdError`: it
carries the gRPC status name (`status`), the library's negative code
(`code`), the daemon address (`addr`), the daemon's or library's own
message (`message`) and, when the daemon answered, the request id it gave
the call (`request_id`, None otherwise): every line the daemon logged
about the call carries it. Its text reads

    tccd at 127.0.0.1:7311 (compile): INVALID_ARGUMENT: ... (request id 3f2a...)

Subclasses let callers react to the kind of failure without parsing text.
"""

# The gRPC status codes (libtccclient returns them negated).
STATUS_NAMES = {
    0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND", 6: "ALREADY_EXISTS",
    7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
    10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL",
    14: "UNAVAILABLE", 15: "DATA_LOSS", 16: "UNAUTHENTICATED",
}


class TccdError(RuntimeError):
    """A call to tccd (or libtccclient) failed."""

    def __init__(self, message, *, status="UNKNOWN", code=None, addr=None, what=None,
                 request_id=None):
        self.message = message
        self.status = status
        self.code = code
        self.addr = addr
        self.what = what  # the operation: "compile", "connect", "run", ...
        self.request_id = request_id or None  # the daemon's x-request-id for the call
        where = f"tccd at {addr}" if addr else "tccd"
        if what:
            where += f" ({what})"
        super().__init__(f"{where}: {status}: {self.detail}")

    @property
    def detail(self):
        """The message with " (request id ID)" when the daemon gave one."""
        if self.request_id:
            return f"{self.message} (request id {self.request_id})"
        return self.message


class TccdUnavailable(TccdError):
    """The daemon cannot be reached (connect timeout, refused, gone)."""


class TccdDeadlineExceeded(TccdError):
    """A call ran past its deadline (TCCD_DEADLINE_MS)."""


class TccdUnsupported(TccdError):
    """The daemon does not implement what was asked (an op, an RPC)."""


class TccdCompileError(TccdError):
    """The daemon refused or failed to compile a graph."""


class TccdKernelError(TccdError):
    """Loading or running a compiled kernel failed in this process."""


class TccdLibraryError(TccdError):
    """libtccclient.so could not be found or loaded."""


_BY_STATUS = {
    "UNAVAILABLE": TccdUnavailable,
    "DEADLINE_EXCEEDED": TccdDeadlineExceeded,
    "UNIMPLEMENTED": TccdUnsupported,
}


def error_for(code, message, *, addr=None, what=None, default=TccdError, request_id=None):
    """The exception for a negative libtccclient code."""
    status = STATUS_NAMES.get(-code, f"STATUS_{-code}") if code else "UNKNOWN"
    cls = _BY_STATUS.get(status, default)
    return cls(message, status=status, code=code, addr=addr, what=what, request_id=request_id)


class TccdFallbackWarning(UserWarning):
    """A graph runs eagerly because tccd failed and fallback="eager"."""
