"""Backend options: from tccd.backend(...), torch.compile(mode=/options=)
and the environment.

| option             | env                      | default          |
|--------------------|--------------------------|------------------|
| addr               | TCCD_ADDR                | 127.0.0.1:7311 (HOST:PORT, [IPV6]:PORT or unix:PATH; checked by libtccclient) |
| mode               |                          | "default"        |
| dynamic            |                          | None (= what Dynamo traced: symbolic shapes or not) |
| fullgraph          |                          | None (= torch.compile's fullgraph) |
| fallback           | TCCD_FALLBACK            | "raise"          |
| deadline_ms        | TCCD_DEADLINE_MS         | 60000; 600000 in the max-autotune modes |
| connect_timeout_ms | TCCD_CONNECT_TIMEOUT_MS  | min(5000, deadline_ms) |
| artifact_dir       | TCCD_ARTIFACT_DIR        | none (no local artifact cache) |
| cpu_isa            | TCCD_CPU_ISA             | "auto" (this host's x86-64 level) |
| ops                | TCCD_OPS                 | "auto": the Ops RPC, else trial compiles ("probe") |
| cuda               | TCCD_CUDA                | "compile": graphs on CUDA tensors are compiled for the device's arch (NVRTC cubin) and launched on the current stream; "eager": they run eagerly |
| aot_cache          | TCCD_AOT_CACHE           | True: AOTAutograd's result is cached on this node (torch's AOTAutogradCache, in TORCHINDUCTOR_CACHE_DIR), so a warm process skips the re-trace; 0/False: always trace |
| plans              | TCCD_PLANS               | True (with aot_cache): a graph's AOTAutograd result and partitioning go to the daemon as a signed plan (plan.py), and a process whose node has no entry starts from the daemon's plan; 0/False: this node's cache only |
| huge_pages         | TCCD_HUGE_PAGES          | True: from an inference graph's first call on CPU, the storages of its nn.Parameter arguments (4 MB and up) are collapsed into 2 MB pages in place, on a thread beside the calls (hugepages.py); 0/False: left as they are |
| eager_guard        | TCCD_EAGER_GUARD         | on in the max-autotune modes, off otherwise: on its first call each partition's kernel is timed against the partition's own ops run eagerly on the same inputs, and a kernel slower than eager gives way (dynamo.py, "the eager guard") |

The environment is read when a backend is made (tccd.backend(...)) or,
for torch.compile(backend="tccd"), when Dynamo hands over a graph.
"""
import dataclasses
import os

from .client import check_addr, default_addr
from .dtypes import MODES
from .errors import TccdLibraryError

FALLBACKS = ("raise", "eager")
# Default deadlines of a compile request: a cold max-autotune compile of a
# 1B-class decoder's layers took over 60 s on 2 cores (2026-11-27)
DEADLINE_MS = 60000
MAX_AUTOTUNE_DEADLINE_MS = 600000
OPS_SOURCES = ("auto", "rpc", "probe")
CUDA_MODES = ("eager", "compile")


def _env_int(name, default):
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        n = int(v)
    except ValueError:
        raise ValueError(f"tccd: {name}={v!r} is not an integer") from None
    if n <= 0:
        raise ValueError(f"tccd: {name}={v!r} must be positive")
    return n


def host_cpu_isa():
    """The x86-64 micro-architecture level of this host ("x86-64-v2"...),
    or "" (the daemon's default) when it cannot be told."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    break
            else:
                return ""
    except OSError:
        return ""
    v2 = {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}
    v3 = {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}
    v4 = {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}
    if not v2 <= flags:
        return "x86-64"
    if not v3 <= flags:
        return "x86-64-v2"
    if not v4 <= flags:
        return "x86-64-v3"
    return "x86-64-v4"


def _bool_option(name, value, env):
    """A yes/no option: `value` if given, else $env ("0"/"1"), else True."""
    if value is None:
        v = os.environ.get(env, "")
        if v == "":
            return True
        if v not in ("0", "1"):
            raise ValueError(f"tccd: {env}={v!r} must be 0 or 1")
        return v == "1"
    if not isinstance(value, bool):
        raise ValueError(f"tccd: {name} must be True or False, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    addr: str
    mode: str = "default"
    dynamic: object = None
    fullgraph: object = None
    fallback: str = "raise"
    deadline_ms: int = 60000
    connect_timeout_ms: int = 5000
    artifact_dir: object = None
    cpu_isa: str = ""
    ops: str = "auto"
    cuda: str = "compile"
    aot_cache: bool = True
    plans: bool = True
    huge_pages: bool = True
    eager_guard: bool = False

    @staticmethod
    def make(**kw):
        """A Config from keyword options over the environment's defaults.
        Unknown options or bad values raise ValueError."""
        fields = {f.name for f in dataclasses.fields(Config)}
        unknown = sorted(set(kw) - fields)
        if unknown:
            raise ValueError(f"tccd: unknown option(s) {', '.join(map(repr, unknown))}; "
                             f"known: {', '.join(sorted(fields))}")
        kw = {k: v for k, v in kw.items() if v is not None}
        kw_addr = bool(kw.get("addr"))
        mode = kw.get("mode", "default")
        default_deadline = MAX_AUTOTUNE_DEADLINE_MS if str(mode).startswith("max-autotune") else DEADLINE_MS
        deadline = int(kw.pop("deadline_ms", 0) or _env_int("TCCD_DEADLINE_MS", default_deadline))
        connect = int(kw.pop("connect_timeout_ms", 0)
                      or _env_int("TCCD_CONNECT_TIMEOUT_MS", min(5000, deadline)))
        cfg = Config(
            addr=kw.pop("addr", None) or default_addr(),
            mode=kw.pop("mode", "default"),
            dynamic=kw.pop("dynamic", None),
            fullgraph=kw.pop("fullgraph", None),
            fallback=kw.pop("fallback", None) or os.environ.get("TCCD_FALLBACK") or "raise",
            deadline_ms=deadline,
            connect_timeout_ms=connect,
            artifact_dir=kw.pop("artifact_dir", None) or os.environ.get("TCCD_ARTIFACT_DIR") or None,
            cpu_isa=kw.pop("cpu_isa", None) or os.environ.get("TCCD_CPU_ISA") or "auto",
            ops=kw.pop("ops", None) or os.environ.get("TCCD_OPS") or "auto",
            cuda=kw.pop("cuda", None) or os.environ.get("TCCD_CUDA") or "compile",
            aot_cache=_bool_option("aot_cache", kw.pop("aot_cache", None), "TCCD_AOT_CACHE"),
            plans=_bool_option("plans", kw.pop("plans", None), "TCCD_PLANS"),
            huge_pages=_bool_option("huge_pages", kw.pop("huge_pages", None), "TCCD_HUGE_PAGES"),
        )
        if cfg.mode not in MODES:
            raise ValueError(f"tccd: unknown mode {cfg.mode!r}; expected one of {', '.join(MODES)}")
        guard = kw.pop("eager_guard", None)
        if guard is None and os.environ.get("TCCD_EAGER_GUARD", "") == "":
            guard = cfg.mode.startswith("max-autotune")
        cfg = dataclasses.replace(cfg, eager_guard=_bool_option("eager_guard", guard,
                                                                 "TCCD_EAGER_GUARD"))
        if cfg.fallback not in FALLBACKS:
            raise ValueError(f"tccd: fallback must be one of {FALLBACKS}, got {cfg.fallback!r}")
        if cfg.ops not in OPS_SOURCES:
            raise ValueError(f"tccd: ops must be one of {OPS_SOURCES}, got {cfg.ops!r}")
        if cfg.cuda not in CUDA_MODES:
            raise ValueError(f"tccd: cuda must be one of {CUDA_MODES}, got {cfg.cuda!r}")
        if cfg.deadline_ms <= 0 or cfg.connect_timeout_ms <= 0:
            raise ValueError("tccd: deadline_ms and connect_timeout_ms must be positive")
        try:
            check_addr(cfg.addr, "addr" if kw_addr else "TCCD_ADDR")
        except TccdLibraryError:
            pass                 # no libtccclient: connecting says so (or falls back)
        if cfg.cpu_isa == "auto":
            cfg = dataclasses.replace(cfg, cpu_isa=host_cpu_isa())
        return cfg

    def replace(self, **kw):
        return dataclasses.replace(self, **kw)
