"""
The Docker image, checked without a Docker engine (issue 19, item 10):
every shared library of the built tccd, tcctl and libtccclient comes from
a package the Dockerfile's runtime stage installs (or one those depend
on), NVRTC is copied in, the build context leaves the venv, NVRTC and
build trees out, and the HEALTHCHECK script works against a daemon that
serves TLS and tokens configured through the environment, as in the image.
"""
import os
import re
import shutil
import subprocess

import pytest

from conftest import BUILD, SOURCE, TCCD, TCCTL, free_port, wait_for

pytestmark = pytest.mark.skipif(shutil.which("dpkg-query") is None, reason="not a Debian system")


def runtime_packages():
    """The packages `apt-get install` names in the Dockerfile's last stage."""
    text = open(os.path.join(SOURCE, "Dockerfile")).read()
    stage = text[text.rindex("\nFROM "):]
    run = re.search(r"apt-get install ([^&]*)&&", stage.replace("\\\n", " ")).group(1)
    return {w for w in run.split() if not w.startswith("-")}


def depends_closure(pkgs):
    """pkgs and everything they depend on (installed alternatives only)."""
    seen, todo = set(), list(pkgs)
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.add(p)
        q = subprocess.run(["dpkg-query", "-W", "-f=${Depends}, ${Pre-Depends}", p], capture_output=True, text=True)
        if q.returncode != 0:
            continue
        for alt in q.stdout.split(","):
            for name in alt.split("|"):
                name = name.strip().split(" ")[0].split(":")[0]
                if name and subprocess.run(["dpkg-query", "-W", name], capture_output=True).returncode == 0:
                    todo.append(name)
                    break
    return seen


def package_of(path):
    for p in (path, os.path.realpath(path), path.replace("/usr/lib/", "/lib/"), path.replace("/lib/", "/usr/lib/", 1)):
        q = subprocess.run(["dpkg", "-S", p], capture_output=True, text=True)
        if q.returncode == 0:
            return q.stdout.split(":")[0]
    return None


def test_runtime_stage_provides_every_shared_library():
    have = depends_closure(runtime_packages())
    binaries = [TCCD, TCCTL, os.path.join(BUILD, "client", "libtccclient.so")]
    missing = []
    for b in binaries:
        out = subprocess.run(["ldd", b], capture_output=True, text=True, check=True).stdout
        for line in out.splitlines():
            m = re.search(r"=> (/\S+)", line)
            if not m:
                continue
            lib = m.group(1)
            if os.path.realpath(lib).startswith((os.path.realpath(BUILD), os.path.realpath(SOURCE), "/usr/local/")):
                continue  # the project's own (installed to /usr/local in the image)
            pkg = package_of(lib)
            assert pkg, f"{lib} (needed by {b}) belongs to no package"
            if pkg not in have:
                missing.append(f"{os.path.basename(b)}: {lib} from {pkg}")
    assert not missing, "the runtime stage lacks: " + "; ".join(missing)


def test_image_carries_nvrtc_healthcheck_and_a_lean_context():
    text = open(os.path.join(SOURCE, "Dockerfile")).read()
    assert "COPY --from=build /src/.deps/cuda /src/.deps/cuda" in text
    assert 'HEALTHCHECK' in text and '"tccd-healthcheck"' in text
    assert os.access(os.path.join(SOURCE, "scripts", "tccd-healthcheck"), os.X_OK)
    ignored = {l.strip() for l in open(os.path.join(SOURCE, ".dockerignore")) if l.strip() and not l.startswith("#")}
    assert {".venv", ".deps", "build", "build-*"} <= ignored, ignored


def test_healthcheck_with_tls_and_tokens_from_the_environment(tmp_path):
    from test_tls import make_ca, make_cert
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    d = str(tmp_path)
    make_ca(d, "ca")
    cert, key = make_cert(d, "server", "ca", "serverAuth")
    tokens = tmp_path / "tokens"
    tokens.write_text("client " + "c" * 32 + "\nadmin " + "a" * 32 + "\n")
    tokens.chmod(0o600)
    port = free_port()
    env = dict(os.environ, TCCD_LISTEN=f"127.0.0.1:{port}", TCCD_CACHE_DIR=str(tmp_path / "cache"),
               TCCD_TLS_CERT=cert, TCCD_TLS_KEY=key, TCCD_AUTH_TOKENS=str(tokens), TCCD_NO_SIGNING="1",
               TCCD_ALLOW_ROOT="1" if os.geteuid() == 0 else "0")
    check = os.path.join(SOURCE, "scripts", "tccd-healthcheck")
    hc_env = dict(env, TCC_TCCTL=TCCTL, TCCD_HEALTHCHECK_CA=os.path.join(d, "ca.pem"))
    assert subprocess.run([check], env=hc_env, capture_output=True, timeout=30).returncode != 0, "nothing serves yet"
    proc = subprocess.Popen([TCCD], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: subprocess.run([check], env=hc_env, capture_output=True, timeout=30).returncode == 0,
                 timeout=30, what="the healthcheck to pass")
        # plaintext against the TLS port fails, as it should
        plain = dict(hc_env)
        for k in ("TCCD_TLS_CERT", "TCCD_TLS_KEY"):
            plain.pop(k)
        assert subprocess.run([check], env=plain, capture_output=True, timeout=30).returncode != 0
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
    assert subprocess.run([check], env=hc_env, capture_output=True, timeout=30).returncode != 0, "stopped"
