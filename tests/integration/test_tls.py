"""
TLS for gRPC (--tls-cert/--tls-key) and mutual TLS (--tls-client-ca): the
test makes a CA, a server certificate for 127.0.0.1, client certificates
from that CA and from a rogue CA with the openssl CLI. A client that
trusts the CA talks to the daemon; a plaintext client, one that trusts
another CA, and (with mTLS) one without a certificate or with a rogue one
cannot. Tokens and TLS together work too.
"""
import os
import secrets
import shutil
import subprocess

import grpc
import pytest

from conftest import GRAPHS, TCC_RUN, TCCD, tcctl

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl CLI not installed")

SIN_COS = os.path.join(GRAPHS, "sin_cos.json")


def openssl(*args, cwd):
    p = subprocess.run(["openssl", *args], capture_output=True, text=True, cwd=cwd, timeout=60)
    assert p.returncode == 0, p.stderr


def make_ca(d, name):
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=tccd test {name}",
            cwd=d)
    return os.path.join(d, f"{name}.pem")


def make_cert(d, name, ca, usage):
    with open(os.path.join(d, f"{name}.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                f"keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)
    os.chmod(os.path.join(d, f"{name}.key"), 0o600)
    return os.path.join(d, f"{name}.pem"), os.path.join(d, f"{name}.key")


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("pki"))
    p = {"ca": make_ca(d, "ca"), "rogue_ca": make_ca(d, "rogue")}
    p["server"] = make_cert(d, "server", "ca", "serverAuth")
    p["client"] = make_cert(d, "client", "ca", "clientAuth")
    p["rogue_client"] = make_cert(d, "rogue_client", "rogue", "clientAuth")
    p["rogue_server"] = make_cert(d, "rogue_server", "rogue", "serverAuth")
    return p


def tls_args(pki, server="server", client_ca=False):
    cert, key = pki[server]
    args = ["--tls-cert", cert, "--tls-key", key]
    return args + (["--tls-client-ca", pki["ca"]] if client_ca else [])


def refused(p):
    assert p.returncode == 1, p.stdout
    assert "UNAVAILABLE" in p.stderr, p.stderr


def test_server_tls(daemon_factory, pki, tmp_path):
    d = daemon_factory(extra_args=tls_args(pki)).start()
    assert "TLS on (server certificate only)" in d.read_log()
    ca = ["--tls-ca", pki["ca"], "--connect-timeout-ms", "3000"]
    assert tcctl(d.addr, *ca, "health", json_out=False, check=False).returncode == 0
    assert tcctl(d.addr, *ca, "compile", SIN_COS)["cache"] == "miss"
    # plaintext, or trusting another CA: no connection
    refused(tcctl(d.addr, "--connect-timeout-ms", "2000", "stats", check=False))
    refused(tcctl(d.addr, "--tls-ca", pki["rogue_ca"], "--connect-timeout-ms", "2000", "stats", check=False))
    # an independent client (grpcio) over TLS
    creds = grpc.ssl_channel_credentials(root_certificates=open(pki["ca"], "rb").read())
    with grpc.secure_channel(d.addr, creds) as ch:
        ch.unary_unary("/tcc.v1.Cache/Stats", request_serializer=None, response_deserializer=None)(b"", timeout=30)
    # libtccclient from the environment (tcc-run: compile, verify, load, run)
    x = tmp_path / "x.bin"
    x.write_bytes(os.urandom(400))
    env = dict(os.environ, TCCD_TLS_CA=pki["ca"])
    p = subprocess.run([TCC_RUN, d.addr, SIN_COS, str(x), str(x), "--", str(tmp_path / "o.bin")],
                       capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, p.stderr
    assert d.stop() == 0


def test_mutual_tls(daemon_factory, pki, tmp_path):
    tokens = tmp_path / "tokens"
    tok = secrets.token_hex(24)
    tokens.write_text(f"admin {tok}\n")
    tokens.chmod(0o600)
    (tmp_path / "tok").write_text(tok)
    d = daemon_factory(extra_args=tls_args(pki, client_ca=True) + ["--auth-tokens", str(tokens)]).start()
    assert "client certificates required and verified" in d.read_log()
    base = ["--tls-ca", pki["ca"], "--connect-timeout-ms", "2000"]
    cert, key = pki["client"]
    good = base + ["--tls-cert", cert, "--tls-key", key, "--token-file", str(tmp_path / "tok")]
    assert tcctl(d.addr, *good, "compile", SIN_COS)["cache"] == "miss"
    tcctl(d.addr, *good, "gc")
    # no client certificate, or one from another CA: the handshake fails
    refused(tcctl(d.addr, *base, "stats", check=False))
    rc, rk = pki["rogue_client"]
    refused(tcctl(d.addr, *base, "--tls-cert", rc, "--tls-key", rk, "stats", check=False))
    # a valid certificate still needs the token (both layers apply)
    p = tcctl(d.addr, *base, "--tls-cert", cert, "--tls-key", key, "stats", check=False)
    assert p.returncode == 1 and "UNAUTHENTICATED" in p.stderr
    # a certificate without its key is a usage error, not a plaintext call
    p = tcctl(d.addr, *base, "--tls-cert", cert, "stats", check=False)
    assert p.returncode == 1 and "INVALID_ARGUMENT" in p.stderr and "key" in p.stderr
    assert d.stop() == 0


def test_client_refuses_a_server_certificate_from_another_ca(daemon_factory, pki):
    d = daemon_factory(extra_args=tls_args(pki, server="rogue_server")).start()
    refused(tcctl(d.addr, "--tls-ca", pki["ca"], "--connect-timeout-ms", "2000", "stats", check=False))
    assert tcctl(d.addr, "--tls-ca", pki["rogue_ca"], "stats")["entries"] == 0
    assert d.stop() == 0


def test_bad_tls_flags(tmp_path, pki):
    extra = (["--allow-root"] if os.geteuid() == 0 else []) + ["--no-signing", "--listen", "127.0.0.1:0",
                                                                 "--cache-dir", str(tmp_path / "c")]
    cert, key = pki["server"]
    garbage = str(tmp_path / "garbage.pem")
    with open(garbage, "w") as f:
        f.write("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    open_key = str(tmp_path / "open.key")
    shutil.copy(key, open_key)
    os.chmod(open_key, 0o644)
    for args, why in ((["--tls-cert", cert], "go together"),
                      (["--tls-client-ca", pki["ca"]], "needs --tls-cert"),
                      (["--tls-cert", cert, "--tls-key", str(tmp_path / "missing.key")], "missing.key"),
                      (["--tls-cert", SIN_COS, "--tls-key", key], "not a PEM certificate"),
                      (["--tls-cert", garbage, "--tls-key", key], f"--tls-cert {garbage}: not a PEM certificate"),
                      (["--tls-cert", cert, "--tls-key", open_key], "may be read by others (mode 644); chmod 600"),
                      (["--tls-cert", cert, "--tls-key", pki["rogue_server"][1]], "is not the key of --tls-cert"),
                      (["--tls-cert", cert, "--tls-key", key, "--tls-client-ca", SIN_COS],
                       "--tls-client-ca " + SIN_COS + ": not a PEM certificate")):
        p = subprocess.run([TCCD, *extra, *args], capture_output=True, text=True, timeout=30)
        assert p.returncode != 0, args
        assert why in p.stderr, p.stderr
