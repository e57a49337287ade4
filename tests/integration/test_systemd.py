"""
The systemd unit (packaging/systemd, issue 23), checked without a running
systemd: `systemd-analyze verify` passes on the unit meson generated (its
ExecStart pointed at the built tccd), tccd.sysusers makes the unit's user
and tccd.tmpfiles gives it the config directory, the example environment
file names only variables tccd reads, and tccd started the way the unit
starts it answers health, compiles and stops with 0 on SIGTERM within
TimeoutStopSec. "The way the unit starts it": the unit's Environment= and
the example EnvironmentFile parsed here, a clean environment, cwd /, a
non-root user without capabilities (setpriv), and ProtectSystem=strict,
ProtectHome and PrivateTmp approximated in a mount namespace (unshare):
everything read-only but the cache directory and a private /tmp.
"""
import os
import re
import shlex
import shutil
import signal
import subprocess
import time

import pytest

from conftest import BUILD, GRAPHS, SOURCE, TCCD, free_port, tcctl, wait_for

UNIT_DIR = os.path.join(BUILD, "packaging", "systemd")
UNIT = os.path.join(UNIT_DIR, "tccd.service")
ENV_EXAMPLE = os.path.join(UNIT_DIR, "tccd.env")
TMPFILES = os.path.join(UNIT_DIR, "tccd.tmpfiles")
SYSUSERS = os.path.join(SOURCE, "packaging", "systemd", "tccd.sysusers")
# what systemd gives a system service before Environment= (systemd.exec(5))
SYSTEMD_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin"


def needs(*tools):
    missing = [t for t in tools if shutil.which(t) is None]
    return pytest.mark.skipif(bool(missing), reason=f"{', '.join(missing)} not installed")


def service_settings(path=UNIT):
    """The [Service] section: each key with the list of its values."""
    settings, section = {}, None
    for line in open(path):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line
        elif section == "[Service]":
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def one(settings, key):
    (value,) = settings[key]
    return value


def env_file(path):
    """An EnvironmentFile as systemd reads it: KEY=VALUE lines, # and ;
    comments, optional quotes around the value."""
    env = {}
    for line in open(path):
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        env[key.strip()] = value
    return env


def seconds(span):
    """A systemd time span of the forms the unit uses: 30, 30s, 2min."""
    m = re.fullmatch(r"(\d+)\s*(s|sec|min)?", span)
    assert m, f"time span {span!r}"
    return int(m.group(1)) * (60 if m.group(2) == "min" else 1)


def unit_environment(settings, env_path, user):
    """The environment systemd would give tccd: its own few variables,
    then Environment= (%C expanded: a system service's cache root), then
    the EnvironmentFile (whose settings win)."""
    env = {"PATH": SYSTEMD_PATH, "HOME": "/", "USER": user, "LOGNAME": user, "SHELL": "/usr/sbin/nologin"}
    for assignments in settings.get("Environment", []):
        for a in shlex.split(assignments):
            key, _, value = a.partition("=")
            value = value.replace("%C", "/var/cache")
            assert "%" not in value, f"a specifier the test does not expand: {a}"
            env[key] = value
    env.update(env_file(env_path))
    return env


def run_verify(path):
    p = subprocess.run(["systemd-analyze", "verify", path], capture_output=True, text=True, timeout=60)
    about_it = [l for l in (p.stdout + p.stderr).splitlines() if os.path.basename(path) in l]
    return p.returncode, about_it


@needs("systemd-analyze")
def test_systemd_analyze_verify_passes_on_the_generated_unit(tmp_path):
    text = open(UNIT).read()
    assert not re.search(r"@[A-Z_]+@", text), "a meson @VAR@ was left unsubstituted"
    exec_start = one(service_settings(), "ExecStart")
    assert os.path.isabs(exec_start) and exec_start.endswith("/bin/tccd"), exec_start
    # verify checks that the binary exists: the built one stands in for
    # the installed one
    unit = tmp_path / "tccd.service"
    unit.write_text(text.replace(f"ExecStart={exec_start}", f"ExecStart={TCCD}"))
    rc, about_it = run_verify(str(unit))
    assert rc == 0 and not about_it, "\n".join(about_it)
    # the check can fail: a setting systemd does not know is reported
    bad = tmp_path / "bad" / "tccd.service"
    bad.parent.mkdir()
    bad.write_text(unit.read_text().replace("[Service]\n", "[Service]\nNoSuchSetting=1\n"))
    assert any("NoSuchSetting" in l for l in run_verify(str(bad))[1])


@needs("systemd-analyze")
def test_security_exposure_stays_low():
    """systemd-analyze security on the unit file (no running systemd
    needed with --offline): docs/operations.md quotes the score."""
    p = subprocess.run(["systemd-analyze", "security", "--offline=yes", UNIT],
                       capture_output=True, text=True, timeout=60)
    if "--offline" in p.stderr and p.returncode != 0:
        pytest.skip("systemd-analyze security has no --offline here")
    m = re.search(r"Overall exposure level for tccd\.service: ([\d.]+)", p.stdout)
    assert m, p.stdout + p.stderr
    assert float(m.group(1)) <= 2.0, p.stdout


def sysusers_root(tmp_path):
    """A scratch root after systemd-sysusers ran tccd.sysusers: its path,
    and the passwd and group entries of the unit's User= and Group=
    (systemd-analyze verify does not look users up)."""
    root = tmp_path / "root"
    (root / "etc").mkdir(parents=True)
    p = subprocess.run(["systemd-sysusers", f"--root={root}", SYSUSERS], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    table = lambda name: {f[0]: f for f in (l.split(":") for l in (root / "etc" / name).read_text().splitlines())}
    s = service_settings()
    return root, table("passwd")[one(s, "User")], table("group")[one(s, "Group")]


@needs("systemd-sysusers")
def test_sysusers_makes_the_units_user(tmp_path):
    _, user, group = sysusers_root(tmp_path)
    assert user[2] != "0" and user[3] == group[2] and user[6].endswith("nologin"), user


@pytest.mark.skipif(os.geteuid() != 0, reason="systemd-tmpfiles chowns what it makes")
@needs("systemd-sysusers", "systemd-tmpfiles")
def test_tmpfiles_makes_the_config_directory(tmp_path):
    """The EnvironmentFile's directory: root's, group tccd, 0750."""
    root, _, group = sysusers_root(tmp_path)
    p = subprocess.run(["systemd-tmpfiles", f"--root={root}", "--create", TMPFILES],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    conf_dir = os.path.dirname(one(service_settings(), "EnvironmentFile").lstrip("-"))
    st = os.stat(str(root) + conf_dir)
    assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (0, int(group[2]), 0o750)


def test_env_example_sets_only_what_tccd_reads():
    """Every TCCD_ name in the example, commented or not, is a flag of
    `tccd --help`; the shutdown grace it mentions fits in TimeoutStopSec;
    exit status 2 (a configuration that cannot work) is not restarted."""
    help_text = subprocess.run([TCCD, "--help"], capture_output=True, text=True, timeout=30).stdout
    flags = {"TCCD_" + f.upper().replace("-", "_") for f in re.findall(r"^\s+--([a-z-]+)", help_text, re.M)}
    text = open(ENV_EXAMPLE).read()
    named = set(re.findall(r"^#?(TCCD_[A-Z0-9_]+)=", text, re.M))
    assert named - flags == set()
    for common in ("LISTEN", "CACHE_MAX_BYTES", "WORKERS", "LOG_LEVEL", "SIGNING_KEY", "AUTH_TOKENS",
                   "TLS_CERT", "TLS_KEY", "REDIS"):
        assert "TCCD_" + common in named
    assert "TCCD_ALLOW_ROOT" not in named
    s = service_settings()
    grace_ms = int(re.search(r"^#?TCCD_SHUTDOWN_GRACE_MS=(\d+)", text, re.M).group(1))
    assert grace_ms / 1000 + 5 <= seconds(one(s, "TimeoutStopSec"))
    assert one(s, "KillMode") == "mixed"  # SIGTERM to tccd alone: its children finish in the grace
    assert "2" in one(s, "RestartPreventExitStatus").split()
    bad = subprocess.run([TCCD], env=dict(unit_environment(s, ENV_EXAMPLE, "tccd"), TCCD_WORKERS="many"),
                         capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "TCCD_WORKERS" in bad.stderr, bad.stderr


# Inside a fresh mount namespace, as root: the cache directory bound on
# the unit's path, every other mount read-only (ProtectSystem=strict), an
# empty /root, /home (ProtectHome) and a private /tmp (PrivateTmp); then
# tccd as nobody with no capabilities and no new privileges.
SANDBOX = r"""
set -e
cache=$1 dest=$2 tccd=$3
mount -t tmpfs -o mode=755 tmpfs "$(dirname "$dest")"
mkdir "$dest"
mount --bind "$cache" "$dest"
# the unit runs an installed tccd; this one may live under /tmp (a CI
# clone), which PrivateTmp hides: its directory is bound beside the cache
bindir="$(dirname "$dest")/.tccd-bin"
mkdir "$bindir"
mount --bind "$(dirname "$tccd")" "$bindir"
tccd="$bindir/$(basename "$tccd")"
for m in $(awk '{print $2}' /proc/self/mounts | sort -u); do
  case $m in /proc|/proc/*|/sys|/sys/*|/dev|/dev/*|"$dest") ;;
             *) mount -o remount,bind,ro "$m" 2>/dev/null || true ;; esac
done
if touch /.tccd-rw-probe 2>/dev/null; then echo "sandbox: / is still writable" >&2; exit 99; fi
for d in /root /home /run/user; do
  if [ -d $d ]; then mount -t tmpfs -o ro,mode=755 tmpfs $d; fi
done
for d in /tmp /var/tmp; do mount -t tmpfs -o mode=1777 tmpfs $d; done
exec setpriv --reuid=nobody --regid=nogroup --clear-groups --no-new-privs \
     --inh-caps=-all --bounding-set=-all -- "$tccd"
"""


def proc_status(pid):
    return dict(l.split(":\t", 1) for l in open(f"/proc/{pid}/status").read().splitlines() if ":\t" in l)


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox needs root (a mount namespace, setpriv)")
@needs("unshare", "setpriv")
def test_tccd_runs_as_the_unit_starts_it(tmp_path):
    s = service_settings()
    port = free_port()
    example = open(ENV_EXAMPLE).read()
    assert re.search(r"^TCCD_LISTEN=", example, re.M), "the example sets TCCD_LISTEN"
    env_path = tmp_path / "tccd.env"
    env_path.write_text(re.sub(r"^TCCD_LISTEN=.*$", f"TCCD_LISTEN=127.0.0.1:{port}", example, flags=re.M))
    env = unit_environment(s, str(env_path), one(s, "User"))
    dest = env["TCCD_CACHE_DIR"]
    assert dest == "/var/cache/" + one(s, "CacheDirectory"), "the cache is the unit's CacheDirectory"

    # what systemd does for CacheDirectory=: made, owned by the user
    cache = tmp_path / "cache"
    cache.mkdir(mode=int(one(s, "CacheDirectoryMode"), 8))
    os.chown(cache, 65534, 65534)
    log = open(tmp_path / "tccd.log", "wb")
    proc = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", SANDBOX,
                             "sandbox", str(cache), dest, TCCD],
                            env=env, cwd="/", stdout=log, stderr=subprocess.STDOUT)
    addr = f"127.0.0.1:{port}"
    read_log = lambda: (tmp_path / "tccd.log").read_text(errors="replace")
    try:
        wait_for(lambda: proc.poll() is not None or
                 tcctl(addr, "health", json_out=False, check=False, timeout=10).returncode == 0,
                 timeout=60, what="tcctl health")
        assert proc.poll() is None, f"tccd exited {proc.returncode}:\n{read_log()}"
        st = proc_status(proc.pid)  # the exec chain ends in tccd: same pid
        assert st["Name"] == "tccd" and st["Uid"].split()[0] == "65534", st
        assert int(st["CapBnd"], 16) == 0 and st["NoNewPrivs"] == "1"

        # a compile: cc in a temp dir under the private /tmp, the entry
        # (and the daemon's own signing key) in the cache directory
        out = tcctl(addr, "compile", os.path.join(GRAPHS, "sin_cos.json"))
        assert out["cache"] == "miss" and out["kernels"] >= 1, out
        assert tcctl(addr, "compile", os.path.join(GRAPHS, "sin_cos.json"))["cache"] == "hit"
        for name in ("cache.db", "signing.key"):
            assert os.stat(cache / name).st_uid == 65534, name

        start = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        limit = seconds(one(s, "TimeoutStopSec"))
        rc = proc.wait(limit)
        assert rc == 0, read_log()
        assert time.monotonic() - start < limit
        assert "stopped" in read_log()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()
