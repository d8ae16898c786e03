"""End to end: TLS and mutual TLS between the processes of a cluster
(``--tls-cert``/``--tls-key``/``--tls-ca`` or ``MILLPOND_TLS_*``;
docs/cluster.md, "TLS and mutual TLS").

* A 2-process cluster over mutual TLS (``-i``/``-a`` with flags, and
  ``-p 2`` with the variables) gives the word count of one process.
* A process whose certificate comes from another CA is refused: every
  process fails with one clear line, a server logs the refusal naming the
  remote address, and no step processed anything.
* A process without TLS against a TLS one is refused both ways, with the
  same guarantees.
* Bad TLS settings (a missing file, a certificate without its key, swapped
  files, a key of another certificate, a certificate the CA did not sign,
  TLS flags for a single process) give one clear line naming the flag or
  variable and the file, exit status 2, and nothing starts.

The CA and the certificates (IP SAN 127.0.0.1, for server and client use)
are made here with ``cryptography``. Every process is a child ``python -m
millpond.run`` (helpers/clusterflows.py) that the ``Cluster`` context
manager stops.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

from helpers.clusterflows import (
    Cluster,
    addresses,
    assert_all_ok,
    diff_outputs,
    expected_wordcount,
    make_run_dir,
    read_outputs,
    run_cluster,
    seen_lines,
    start_process,
    tails,
)
from helpers.mpflow import Result

x509 = pytest.importorskip("cryptography.x509", reason="the TLS tests make certificates with cryptography")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402

#: Runs that should work: a broken start fails in seconds, not a minute.
OK_ENV = {"MILLPOND_START_TIMEOUT": "30", "MILLPOND_PEER_TIMEOUT": "5"}
#: Starts that must fail: how long the processes wait for each other.
START_TIMEOUT = 3.0
FAIL_ENV = {"MILLPOND_START_TIMEOUT": str(START_TIMEOUT), "MILLPOND_PEER_TIMEOUT": "3"}
EPOCH = ["-s", "0.05"]

ERROR_LINE = re.compile(r"^python -m millpond\.run: error: (.*)$", re.M)
#: How the core logs a connection it refused (logger millpond.core).
REFUSAL = re.compile(r"WARNING millpond\.core: refused a cluster connection .*remote=127\.0\.0\.1:\d+ reason=(.*)$", re.M)


def error_lines(res: Result) -> List[str]:
    return ERROR_LINE.findall(res.stderr)


def one_error(res: Result, *fragments: str) -> str:
    """The run failed with exactly one error line holding every fragment."""
    assert res.returncode not in (0, None), f"exited 0:\n{res}"
    lines = error_lines(res)
    assert len(lines) == 1, f"expected exactly one error line:\n{res}"
    for frag in fragments:
        assert frag in lines[0], f"the error line does not name {frag!r}: {lines[0]}"
    assert "Traceback" not in res.stderr, res.stderr
    return lines[0]


# ---------------------------------------------------------------------------
# Certificates


@dataclass
class Issued:
    cert: Path
    key: Path


@dataclass
class CA:
    """A certificate authority made for the tests."""

    name: str
    dir: Path
    key: ec.EllipticCurvePrivateKey
    certificate: "x509.Certificate"
    file: Path

    @classmethod
    def make(cls, d: Path, name: str) -> "CA":
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"millpond test {name}")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True, content_commitment=False,
                              key_encipherment=False, data_encipherment=False, key_agreement=False,
                              encipher_only=False, decipher_only=False),
                critical=True,
            )
            .sign(key, hashes.SHA256())
        )
        file = d / f"{name}-ca.pem"
        file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return cls(name, d, key, cert, file)

    def issue(self, name: str, hosts: Sequence[str] = ("127.0.0.1",)) -> Issued:
        """A certificate for ``hosts`` (IP SANs for addresses), for server
        and client use, and its unencrypted PKCS #8 key."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        sans: List[x509.GeneralName] = []
        for h in hosts:
            try:
                sans.append(x509.IPAddress(ipaddress.ip_address(h)))
            except ValueError:
                sans.append(x509.DNSName(h))
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .sign(self.key, hashes.SHA256())
        )
        issued = Issued(self.dir / f"{self.name}-{name}.pem", self.dir / f"{self.name}-{name}-key.pem")
        issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        issued.key.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                 serialization.NoEncryption()))
        return issued


@dataclass
class PKI:
    ca: CA
    other: CA  # another CA: its certificates are strangers to ``ca``
    procs: List[Issued]  # one certificate per process, from ``ca``
    intruder: Issued  # from ``other``


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> PKI:
    d = tmp_path_factory.mktemp("pki")
    ca = CA.make(d, "ca")
    other = CA.make(d, "other")
    return PKI(ca, other, [ca.issue(f"p{i}") for i in range(2)], other.issue("intruder"))


def tls_flags(issued: Optional[Issued], ca: Optional[CA]) -> List[str]:
    if issued is None:
        return []
    flags = ["--tls-cert", str(issued.cert), "--tls-key", str(issued.key)]
    return flags + (["--tls-ca", str(ca.file)] if ca is not None else [])


def wait_listening(addr: str, timeout: float = 30) -> None:
    """Wait until something accepts TCP connections at ``addr`` (a connect
    that sends nothing: the server refuses nothing and logs nothing)."""
    host, port = addr.rsplit(":", 1)
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise AssertionError(f"nothing listens on {addr} after {timeout:.0f} s") from None
            time.sleep(0.05)


def refusals(results: Sequence[Result]) -> List[str]:
    """The reasons of every refused connection the processes logged."""
    return [m for r in results for m in REFUSAL.findall(r.stderr)]


# ---------------------------------------------------------------------------
# 1. A cluster over mutual TLS


@pytest.mark.parametrize("mode", ["ia-flags", "p-flags", "p-env"])
def test_mutual_tls_cluster_gives_the_word_count(tmp_path: Path, pki: PKI, mode: str) -> None:
    """Two processes over mutual TLS, each with its own certificate (``-i``
    / ``-a`` with the flags), or one ``-p 2`` launcher that hands its
    processes the flags, or whose processes take the files from
    ``MILLPOND_TLS_*``: the output is the word count of one process, and
    every process says it joined over mutual TLS."""
    d = make_run_dir(tmp_path, files=4, lines=60, worker_counts=(2, 4))
    if mode == "ia-flags":
        results = run_cluster(d, tmp_path / "logs", "cflows:wordcount()", 2, 2, "ia",
                              lambda i: [*EPOCH, *tls_flags(pki.procs[i], pki.ca)], OK_ENV)
    elif mode == "p-flags":
        results = run_cluster(d, tmp_path / "logs", "cflows:wordcount()", 2, 2, "p",
                              lambda i: [*EPOCH, *tls_flags(pki.procs[0], pki.ca)], OK_ENV)
    else:
        env = {**OK_ENV, "MILLPOND_TLS_CERT": str(pki.procs[0].cert), "MILLPOND_TLS_KEY": str(pki.procs[0].key),
               "MILLPOND_TLS_CA": str(pki.ca.file)}
        results = run_cluster(d, tmp_path / "logs", "cflows:wordcount()", 2, 2, "p", lambda i: EPOCH, env)
    assert_all_ok(results)
    problem = diff_outputs(read_outputs(d), expected_wordcount(d))
    assert not problem, f"the TLS cluster's output differs from the word count:\n{problem}\n{tails(results)}"
    joined = [line for r in results for line in r.stderr.splitlines() if "joining the cluster at" in line]
    assert len(joined) == 2 and all(line.endswith("over mutual TLS") for line in joined), joined
    assert refusals(results) == [], "a connection was refused in a cluster that works"


# ---------------------------------------------------------------------------
# 2. Refused peers


def test_certificate_from_another_ca_is_refused(tmp_path: Path, pki: PKI) -> None:
    """Process 1 has a certificate of another CA (and trusts that CA):
    neither process starts, each fails with one line about the
    certificate, a server logs the refused connection with the remote
    address, and no step processed anything."""
    d = make_run_dir(tmp_path, files=2, lines=20, worker_counts=(2,))
    addrs = addresses(2)
    with Cluster(tmp_path / "logs") as cluster:
        p0 = start_process(cluster, d, "cflows:watch()", 0, addrs, 1, [*EPOCH, *tls_flags(pki.procs[0], pki.ca)],
                           FAIL_ENV)
        wait_listening(addrs[0])
        p1 = start_process(cluster, d, 'cflows:watch("in", "intruder.txt")', 1, addrs, 1,
                           [*EPOCH, *tls_flags(pki.intruder, pki.other)], FAIL_ENV)
        results = cluster.wait([p0, p1], START_TIMEOUT + 30)
    # The intruder reached process 0 first: it does not trust process 0's
    # CA. Process 0 refused it, or did not trust its certificate either.
    one_error(results[1], f"process 0 ({addrs[0]}) failed TLS authentication: its certificate is not signed by this "
                          "process's CA")
    line0 = one_error(results[0], addrs[1])
    assert "certificate" in line0, line0
    reasons = refusals(results)
    assert reasons, f"no process logged a refused connection:\n{tails(results)}"
    assert any("certificate" in r for r in reasons), reasons
    assert seen_lines(d) == [], f"steps processed items: {seen_lines(d)[:5]}"
    for name in ("out.txt", "intruder.txt"):
        assert not (d / name).exists() or (d / name).read_text() == ""
    assert all(r.stdout == "" for r in results)


def test_process_without_tls_is_refused(tmp_path: Path, pki: PKI) -> None:
    """Process 0 has mutual TLS, process 1 none: process 1 fails naming
    process 0 as one that uses TLS, process 0 logs that a connection spoke
    plain text and fails too (naming process 1: it does not use TLS, or did
    not join); nothing was processed."""
    d = make_run_dir(tmp_path, files=2, lines=20, worker_counts=(2,))
    addrs = addresses(2)
    with Cluster(tmp_path / "logs") as cluster:
        p0 = start_process(cluster, d, "cflows:watch()", 0, addrs, 1, [*EPOCH, *tls_flags(pki.procs[0], pki.ca)],
                           FAIL_ENV)
        wait_listening(addrs[0])
        p1 = start_process(cluster, d, "cflows:watch()", 1, addrs, 1, EPOCH, FAIL_ENV)
        results = cluster.wait([p0, p1], START_TIMEOUT + 30)
    one_error(results[1], f"process 0 ({addrs[0]}) uses TLS (it answered with a TLS record) and this process does "
                          "not: every process must be started with the same TLS settings")
    one_error(results[0], f"process 1 ({addrs[1]})", "TLS")
    reasons = refusals([results[0]])
    assert any("it speaks plain text and this process requires TLS" in r for r in reasons), (
        f"process 0 did not log the plain-text connection:\n{results[0]}"
    )
    assert seen_lines(d) == [], f"steps processed items: {seen_lines(d)[:5]}"


# ---------------------------------------------------------------------------
# 3. Bad settings: one line, status 2, nothing started


def _one(tmp_path: Path, argv: Sequence[str], env: Optional[Dict[str, str]] = None, mode: str = "single") -> Result:
    d = make_run_dir(tmp_path / "run", files=1, lines=5)
    [res] = run_cluster(d, tmp_path / "logs", "cflows:wordcount()", 2 if mode == "p" else 1, 1, mode,
                        lambda i: list(argv), {**FAIL_ENV, **(env or {})}, timeout=60)
    assert not (d / "out").exists() or not any(p.read_text() for p in (d / "out").iterdir())
    # (The core's own checks of the files come after "joining the cluster"
    # is logged, before anything listens.)
    assert "every process of the cluster is connected" not in res.stderr, f"a process started:\n{res}"
    assert "cluster mesh up" not in res.stderr, f"a process started:\n{res}"
    return res


@pytest.mark.parametrize("how", ["flag", "env", "flag-p"])
def test_missing_certificate_file_gives_one_clear_error(tmp_path: Path, pki: PKI, how: str) -> None:
    """A certificate file that does not exist: one line naming the flag (or
    the variable) and the file, status 2, no process started; with ``-p 2``
    the launcher says it once, before starting any process."""
    missing = tmp_path / "no-such-cert.pem"
    files = ["--tls-key", str(pki.procs[0].key), "--tls-ca", str(pki.ca.file)]
    if how == "env":
        argv = ["-i", "0", "-a", ";".join(addresses(2)), *files]
        res = _one(tmp_path, argv, {"MILLPOND_TLS_CERT": str(missing)})
        one_error(res, f"MILLPOND_TLS_CERT='{missing}': cannot be read: No such file or directory")
    elif how == "flag":
        argv = ["-i", "0", "-a", ";".join(addresses(2)), "--tls-cert", str(missing), *files]
        res = _one(tmp_path, argv)
        one_error(res, f"--tls-cert {missing}: cannot be read: No such file or directory")
    else:
        res = _one(tmp_path, ["--tls-cert", str(missing), *files], mode="p")
        one_error(res, f"--tls-cert {missing}: cannot be read: No such file or directory")
        assert "started 2 processes" not in res.stderr
    assert res.returncode == 2


@pytest.mark.parametrize("case", [
    "cert without key", "key without cert", "CA without cert", "swapped", "key of another cert",
    "cert not signed by the CA", "cert for another host", "flag without a cluster",
])
def test_bad_tls_settings_give_one_clear_error(tmp_path: Path, pki: PKI, case: str) -> None:
    p0, p1, ca = pki.procs[0], pki.procs[1], pki.ca.file
    cluster = ["-i", "0", "-a", ";".join(addresses(2))]
    wrong_host = pki.ca.issue("wrong-host", hosts=["pod-0.flow"]) if case == "cert for another host" else None
    argv: List[str]
    want: Tuple[str, ...]
    if case == "cert without key":
        argv, want = ["--tls-cert", str(p0.cert)], (f"--tls-cert {p0.cert} needs its private key",
                                                      "--tls-key (or MILLPOND_TLS_KEY)")
    elif case == "key without cert":
        argv, want = ["--tls-key", str(p0.key)], (f"--tls-key {p0.key} needs its certificate",)
    elif case == "CA without cert":
        argv, want = ["--tls-ca", str(ca)], (f"--tls-ca {ca} needs this process's certificate and key",)
    elif case == "swapped":
        argv = ["--tls-cert", str(p0.key), "--tls-key", str(p0.cert)]
        want = (f"--tls-cert {p0.key}: holds a private key, not a certificate (are the certificate and key files "
                "swapped?)",)
    elif case == "key of another cert":
        argv = ["--tls-cert", str(p0.cert), "--tls-key", str(p1.key)]
        want = (f"--tls-key {p1.key}: does not belong to the certificate in {p0.cert}",)
    elif case == "cert not signed by the CA":
        argv = tls_flags(pki.intruder, pki.ca)
        want = (f"TLS certificate file {pki.intruder.cert} is not signed by the CA in {ca}",)
    elif case == "cert for another host":
        assert wrong_host is not None
        argv = tls_flags(wrong_host, pki.ca)
        want = (f"TLS certificate file {wrong_host.cert} is not valid for 127.0.0.1, the host of this process's "
                "address",)
    else:
        cluster = []
        argv, want = tls_flags(p0, pki.ca), ("--tls-cert is for a cluster: give -i/--process-id and -a/--addresses",)
    res = _one(tmp_path, [*cluster, *argv])
    one_error(res, *want)
    assert res.returncode == 2, res


def test_tls_variables_mean_nothing_to_a_single_process(tmp_path: Path) -> None:
    """Like the other cluster variables, ``MILLPOND_TLS_*`` are read only
    by the processes of a cluster: a single process runs."""
    d = make_run_dir(tmp_path / "run", files=1, lines=5)
    env = {**OK_ENV, "MILLPOND_TLS_CERT": str(tmp_path / "none.pem"), "MILLPOND_TLS_KEY": str(tmp_path / "none.pem")}
    [res] = run_cluster(d, tmp_path / "logs", "cflows:wordcount()", 1, 1, "single", lambda i: EPOCH, env)
    assert_all_ok([res])
    assert not diff_outputs(read_outputs(d), expected_wordcount(d))


def test_plain_text_client_gets_no_data_from_a_tls_process(tmp_path: Path, pki: PKI) -> None:
    """Something that speaks plain HTTP/2 to a TLS process gets one TLS
    alert record and nothing else; the process logs it once, with the
    remote address, and keeps waiting for its peers."""
    d = make_run_dir(tmp_path, files=1, lines=5)
    addrs = addresses(2)
    with Cluster(tmp_path / "logs") as cluster:
        p0 = start_process(cluster, d, "cflows:watch()", 0, addrs, 1, [*EPOCH, *tls_flags(pki.procs[0], pki.ca)],
                           FAIL_ENV)
        wait_listening(addrs[0])
        host, port = addrs[0].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            local = "%s:%d" % s.getsockname()[:2]
            s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00" * 64)
            got = b""
            while True:
                chunk = s.recv(4096)
                if not chunk:
                    break
                got += chunk
        [res] = cluster.wait([p0], START_TIMEOUT + 30)
    assert got[:1] == b"\x15" and len(got) == 7, f"not one TLS alert record: {got!r}"
    logged = [m for m in REFUSAL.finditer(res.stderr)]
    assert len(logged) == 1, res.stderr
    assert f"remote={local}" in logged[0].group(0) and "speaks plain text" in logged[0].group(1)
    one_error(res, f"process 1 ({addrs[1]}) did not join within 3s", f"a connection from {local} was refused")
