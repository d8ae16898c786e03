"""A real, single-node Apache Kafka broker (KRaft) for tests and benchmarks.

Pure standard library, so the tests (``tests/helpers/kafka.py``) and the
benchmark scripts can load it by path::

    import importlib.util, sys
    spec = importlib.util.spec_from_file_location("mp_kafka_broker", "tools/kafka/broker.py")
    broker = importlib.util.module_from_spec(spec); sys.modules[spec.name] = broker
    spec.loader.exec_module(broker)

    with broker.Broker() as b:          # fetches the jars once, starts, waits until it answers
        print(b.bootstrap)              # "127.0.0.1:PORT"

Jars: ``fetch()`` runs ``mvn dependency:copy-dependencies`` over
``tools/kafka/pom.xml`` (``org.apache.kafka:kafka_2.13`` and slf4j-simple)
into ``<cache>/lib``. The cache is ``build/kafka`` in the repo unless
``MILLPOND_KAFKA_CACHE`` names another directory. The copy goes to a
temporary directory that is renamed into place, and a marker file (holding
a hash of the pom) is written last, all under an ``fcntl`` lock: two
pytest-xdist workers may fetch at the same time, and a killed fetch never
leaves a half cache that looks complete.

Broker: ``process.roles=broker,controller`` on free 127.0.0.1 ports,
replication factors 1 (the offsets and transaction-state topics included),
``auto.create.topics.enable=false`` (a missing topic is an error), its data
and its log in a temporary directory removed by ``stop()``.

With ``sasl_users`` a third listener, SASL_PLAINTEXT with the PLAIN
mechanism and those users, is opened and the broker runs the
``StandardAuthorizer``: clients of the PLAINTEXT listener are
``User:ANONYMOUS`` and a super user (they may do anything, as without
ACLs), and so is ``User:admin``; any other SASL user may do only what ACLs
grant it (``allow.everyone.if.no.acl.found=false``). A test connects as
such a user to see an operation refused.

Command line::

    python tools/kafka/broker.py fetch            # fetch the jars into the cache
    python tools/kafka/broker.py run [--acl]      # start a broker, print its address, run until Ctrl-C
"""

from __future__ import annotations

import argparse
import atexit
import base64
import contextlib
import errno
import fcntl
import hashlib
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Optional

log = logging.getLogger("millpond.tools.kafka")

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
POM = HERE / "pom.xml"
KAFKA_VERSION = "4.4.0"

#: The SASL users of ``Broker(sasl_users=DEFAULT_SASL_USERS)``: ``admin``
#: is a super user, ``limited`` may do only what ACLs allow.
DEFAULT_SASL_USERS: Dict[str, str] = {"admin": "admin-secret", "limited": "limited-secret"}

#: How long a broker may take to answer after it is started.
START_TIMEOUT = 90.0
#: How long a fetch of the jars may take (the first one downloads ~45 MB).
FETCH_TIMEOUT = 900.0
#: How long ``stop()`` waits after SIGTERM before it sends SIGKILL.
STOP_TIMEOUT = 20.0


class BrokerUnavailable(RuntimeError):
    """A broker cannot be had on this machine: ``java`` or ``mvn`` is missing.
    Tests skip on it (with this message); everything else is an error."""


class BrokerError(RuntimeError):
    """The jars could not be fetched or the broker did not start or answer."""


# --------------------------------------------------------------------------- jars

def cache_dir() -> Path:
    """``$MILLPOND_KAFKA_CACHE`` or ``build/kafka`` in the repo."""
    env = os.environ.get("MILLPOND_KAFKA_CACHE")
    return Path(env).resolve() if env else REPO / "build" / "kafka"


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def _need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        raise BrokerUnavailable(
            f"`{tool}` is not on PATH: the Kafka test broker needs Java 17+ (java) and Maven (mvn) "
            f"(Debian: apt-get install openjdk-17-jre-headless maven)")
    return path


def _complete(cache: Path) -> bool:
    marker = cache / "lib.complete"
    try:
        return marker.read_text().strip() == _pom_hash() and any((cache / "lib").glob("kafka_2.13-*.jar"))
    except OSError:
        return False


@contextlib.contextmanager
def _locked(path: Path, timeout: float) -> Iterator[None]:
    """An exclusive ``fcntl`` lock on ``path``, waited for at most ``timeout`` s."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as f:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
                if time.monotonic() > deadline:
                    raise BrokerError(f"waited {timeout:.0f} s for the lock {path} (another fetch still running?)")
                time.sleep(0.2)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)


def fetch(cache: Optional[Path] = None, timeout: float = FETCH_TIMEOUT) -> Path:
    """The directory of the broker's jars, fetched with Maven unless already
    there (and made for the current pom). Raises :class:`BrokerUnavailable`
    without ``mvn`` (or ``java``), :class:`BrokerError` if Maven fails."""
    cache = (cache or cache_dir()).resolve()
    lib = cache / "lib"
    if _complete(cache):
        return lib
    _need("java")
    mvn = _need("mvn")
    with _locked(cache / ".fetch.lock", timeout):
        if _complete(cache):  # another process fetched while we waited
            return lib
        tmp = Path(tempfile.mkdtemp(prefix="lib.tmp-", dir=cache))
        try:
            log.info("fetching the Kafka %s jars into %s (mvn, about a minute the first time)", KAFKA_VERSION, lib)
            t0 = time.monotonic()
            cmd = [mvn, "-q", "-B", "dependency:copy-dependencies", f"-DoutputDirectory={tmp}", "-f", str(POM)]
            try:
                res = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                     timeout=timeout)
            except subprocess.TimeoutExpired as e:
                raise BrokerError(f"`{' '.join(cmd)}` did not finish within {timeout:.0f} s") from e
            if res.returncode != 0:
                out = (res.stdout + res.stderr).strip()[-4000:]
                raise BrokerError(f"`{' '.join(cmd)}` exited {res.returncode}:\n{out}")
            if not any(tmp.glob("kafka_2.13-*.jar")):
                raise BrokerError(f"mvn copied no kafka_2.13 jar into {tmp}")
            (cache / "lib.complete").unlink(missing_ok=True)
            if lib.exists():
                shutil.rmtree(lib)
            os.replace(tmp, lib)
            marker_tmp = cache / "lib.complete.tmp"
            marker_tmp.write_text(_pom_hash() + "\n")
            os.replace(marker_tmp, cache / "lib.complete")
            log.info("fetched %d jars in %.1f s", len(list(lib.glob("*.jar"))), time.monotonic() - t0)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return lib


# --------------------------------------------------------------------------- broker

def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cluster_id() -> str:
    """A Kafka cluster id: 16 random bytes, URL-safe base64 without padding
    (what ``StorageTool random-uuid`` prints; never starting with '-')."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def api_versions_ok(host: str, port: int, timeout: float = 5.0) -> bool:
    """Whether the broker at ``host:port`` answers an ApiVersions request
    (v0, plain Kafka protocol over a socket) without an error."""
    correlation = 7
    client = b"millpond-probe"
    body = struct.pack(">hhih", 18, 0, correlation, len(client)) + client
    try:
        with socket.create_connection((host, port), timeout=timeout) as s:
            s.settimeout(timeout)
            s.sendall(struct.pack(">i", len(body)) + body)
            head = _recv_exact(s, 4)
            (size,) = struct.unpack(">i", head)
            if size < 6 or size > 1 << 20:
                return False
            resp = _recv_exact(s, size)
    except OSError:
        return False
    corr, err = struct.unpack(">ih", resp[:6])
    return corr == correlation and err == 0


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return buf


class Broker:
    """One KRaft broker+controller process on 127.0.0.1.

    ``start()`` fetches the jars if needed, formats the storage, starts
    ``java ... kafka.Kafka server.properties`` and waits (at most
    ``start_timeout`` s) until every listener answers; ``stop()`` ends it
    (SIGTERM, then SIGKILL) and removes its directory. Also a context manager.
    """

    def __init__(self, *, sasl_users: Optional[Mapping[str, str]] = None, cache: Optional[Path] = None,
                 start_timeout: float = START_TIMEOUT, heap: str = "512m", keep_dir: bool = False,
                 extra_properties: Optional[Mapping[str, str]] = None) -> None:
        self.sasl_users = dict(sasl_users) if sasl_users else {}
        if self.sasl_users and "admin" not in self.sasl_users:
            raise ValueError("sasl_users needs an 'admin' user (the super user)")
        self.cache = cache
        self.start_timeout = start_timeout
        self.heap = heap
        self.keep_dir = keep_dir
        self.extra_properties = dict(extra_properties or {})
        self.dir: Optional[Path] = None
        self.proc: Optional["subprocess.Popen[bytes]"] = None
        self.port = 0
        self.controller_port = 0
        self.sasl_port = 0
        self.start_seconds = 0.0
        self._log_file: Optional[object] = None
        self._lock = threading.Lock()

    # ---- addresses and client settings

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the PLAINTEXT listener (a super user there)."""
        return f"127.0.0.1:{self.port}"

    @property
    def sasl_bootstrap(self) -> str:
        """``127.0.0.1:PORT`` of the SASL_PLAINTEXT listener (``sasl_users`` only)."""
        if not self.sasl_port:
            raise BrokerError("this broker has no SASL listener (start it with sasl_users)")
        return f"127.0.0.1:{self.sasl_port}"

    def sasl_config(self, user: str) -> Dict[str, str]:
        """librdkafka (confluent-kafka) settings to connect as ``user`` over SASL/PLAIN."""
        return {
            "bootstrap.servers": self.sasl_bootstrap,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanisms": "PLAIN",
            "sasl.username": user,
            "sasl.password": self.sasl_users[user],
        }

    @property
    def log_path(self) -> Optional[Path]:
        return self.dir / "broker.log" if self.dir else None

    def log_tail(self, lines: int = 40) -> str:
        path = self.log_path
        if path is None or not path.exists():
            return "(no broker log)"
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", "replace")
        return "\n".join(text.splitlines()[-lines:])

    # ---- life cycle

    def __enter__(self) -> "Broker":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def properties(self) -> Dict[str, str]:
        assert self.dir is not None
        listeners = [f"PLAINTEXT://127.0.0.1:{self.port}", f"CONTROLLER://127.0.0.1:{self.controller_port}"]
        protocols = ["PLAINTEXT:PLAINTEXT", "CONTROLLER:PLAINTEXT"]
        props = {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": "1",
            "default.replication.factor": "1",
            "min.insync.replicas": "1",
            "offsets.topic.replication.factor": "1",
            # fewer partitions than the default 50: the topics appear faster
            "offsets.topic.num.partitions": "5",
            "transaction.state.log.replication.factor": "1",
            "transaction.state.log.min.isr": "1",
            "transaction.state.log.num.partitions": "5",
            "share.coordinator.state.topic.replication.factor": "1",
            "share.coordinator.state.topic.min.isr": "1",
            "group.initial.rebalance.delay.ms": "0",
            # a transaction left open by a killed producer whose id is never
            # used again is aborted soon (its producer's transaction.timeout.ms)
            "transaction.abort.timed.out.transaction.cleanup.interval.ms": "5000",
            "auto.create.topics.enable": "false",
            "delete.topic.enable": "true",
            "num.network.threads": "2",
            "num.io.threads": "4",
            "background.threads": "4",
            "log.retention.check.interval.ms": "3600000",
        }
        if self.sasl_users:
            listeners.append(f"SASL_PLAINTEXT://127.0.0.1:{self.sasl_port}")
            protocols.append("SASL_PLAINTEXT:SASL_PLAINTEXT")
            users = " ".join(f'user_{u}="{p}"' for u, p in sorted(self.sasl_users.items()))
            props.update({
                "sasl.enabled.mechanisms": "PLAIN",
                "listener.name.sasl_plaintext.plain.sasl.jaas.config":
                    f"org.apache.kafka.common.security.plain.PlainLoginModule required {users};",
                "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                # PLAINTEXT (tests' own clients, inter-broker, controller) and admin may do anything
                "super.users": "User:ANONYMOUS;User:admin",
                "allow.everyone.if.no.acl.found": "false",
            })
        props["listeners"] = ",".join(listeners)
        props["advertised.listeners"] = ",".join(x for x in listeners if not x.startswith("CONTROLLER:"))
        props["listener.security.protocol.map"] = ",".join(protocols)
        props.update(self.extra_properties)
        return props

    def start(self) -> "Broker":
        with self._lock:
            if self.proc is not None:
                return self
            java = _need("java")
            lib = fetch(self.cache)
            t0 = time.monotonic()
            self.dir = Path(tempfile.mkdtemp(prefix="mp-kafka-"))
            try:
                self._start(java, lib)
            except BaseException:
                self._stop_locked()
                raise
            self.start_seconds = time.monotonic() - t0
            atexit.register(self.stop)
            log.info("Kafka broker on %s started in %.1f s (log %s)", self.bootstrap, self.start_seconds,
                     self.log_path)
            return self

    def _start(self, java: str, lib: Path) -> None:
        assert self.dir is not None
        self.port, self.controller_port = free_port(), free_port()
        if self.sasl_users:
            self.sasl_port = free_port()
        conf = self.dir / "server.properties"
        conf.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        classpath = f"{lib}/*"
        jvm = [java, f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-Djava.awt.headless=true",
               "-Dorg.slf4j.simpleLogger.showDateTime=true",
               "-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
               "-cp", classpath]
        fmt = subprocess.run(jvm + ["kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(conf)],
                             stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if fmt.returncode != 0:
            raise BrokerError(f"kafka.tools.StorageTool format exited {fmt.returncode}:\n"
                              f"{(fmt.stdout + fmt.stderr)[-4000:]}")
        log_file = open(self.dir / "broker.log", "wb")
        self._log_file = log_file
        # A new session (a Ctrl-C at a terminal reaches only us, and we stop
        # it), under a watchdog shell that ends the broker when our end of
        # its stdin closes: a process killed without stopping its broker
        # (SIGKILL of pytest) leaves no JVM behind.
        self.proc = subprocess.Popen(["sh", "-c", _WATCHDOG, "kafka-watchdog", *jvm, "kafka.Kafka", str(conf)],
                                     stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT,
                                     cwd=self.dir, start_new_session=True)
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        ports = [self.port] + ([self.sasl_port] if self.sasl_port else [])
        while True:
            code = self.proc.poll()
            if code is not None:
                raise BrokerError(f"the Kafka broker exited {code} while starting; its log ends:\n{self.log_tail()}")
            if api_versions_ok("127.0.0.1", self.port, timeout=2.0) and all(_accepts(p) for p in ports[1:]):
                return
            if time.monotonic() > deadline:
                raise BrokerError(f"the Kafka broker did not answer on {self.bootstrap} within "
                                  f"{self.start_timeout:.0f} s; its log ends:\n{self.log_tail()}")
            time.sleep(0.25)

    def stop(self) -> Optional[int]:
        """End the broker (SIGTERM, SIGKILL after ``STOP_TIMEOUT`` s) and
        remove its directory; return its exit status. Safe to call twice."""
        with self._lock:
            return self._stop_locked()

    def _stop_locked(self) -> Optional[int]:
        code: Optional[int] = None
        proc, self.proc = self.proc, None
        if proc is not None:
            # the process group of the watchdog shell: the shell, the JVM
            # and the shell's stdin reader
            if proc.poll() is None:
                _killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_TIMEOUT)
                except subprocess.TimeoutExpired:
                    log.warning("the Kafka broker (pid %d) did not stop within %.0f s of SIGTERM: SIGKILL",
                                proc.pid, STOP_TIMEOUT)
            _killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group
            if proc.poll() is None:
                proc.wait(timeout=30)
            if proc.stdin is not None:
                with contextlib.suppress(OSError):
                    proc.stdin.close()
            code = proc.returncode
        if self._log_file is not None:
            self._log_file.close()  # type: ignore[attr-defined]
            self._log_file = None
        if self.dir is not None and not self.keep_dir:
            shutil.rmtree(self.dir, ignore_errors=True)
            self.dir = None
        with contextlib.suppress(Exception):
            atexit.unregister(self.stop)
        return code


#: ``sh -c`` script: run "$@" (the JVM) in the background, pass SIGTERM
#: and SIGINT on to it, end it when stdin (a pipe from the Python that
#: started it) reaches EOF, i.e. when that process is gone; exit with the
#: JVM's status.
_WATCHDOG = """
exec 3<&0
"$@" 0</dev/null &
pid=$!
trap 'kill -TERM $pid 2>/dev/null' TERM INT
{ read _line <&3; kill -TERM $pid 2>/dev/null; } &
rc=0
while kill -0 $pid 2>/dev/null; do wait $pid; rc=$?; done
exit $rc
"""


def _killpg(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


# --------------------------------------------------------------------------- CLI

def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/kafka/broker.py",
                                     description="A single-node Kafka broker for millpond's tests and benchmarks.")
    sub = parser.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="fetch the broker's jars into the cache (once)")
    f.add_argument("--if-available", action="store_true",
                   help="exit 0 with a note when java or mvn is missing (for make test)")
    r = sub.add_parser("run", help="start a broker, print its bootstrap address, run until Ctrl-C")
    r.add_argument("--acl", action="store_true",
                   help="also a SASL_PLAINTEXT listener (users admin, limited) and the ACL authorizer")
    r.add_argument("--keep", action="store_true", help="keep the broker's directory (data, log) afterwards")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")

    if args.cmd == "fetch":
        try:
            lib = fetch()
        except BrokerUnavailable as e:
            print(f"no Kafka broker here: {e}", file=sys.stderr)
            return 0 if args.if_available else 2
        except BrokerError as e:
            print(f"fetching the Kafka jars failed: {e}", file=sys.stderr)
            return 1
        print(lib)
        return 0

    def _terminate(_sig: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM stops the broker too (it runs in its own session)

    signal.signal(signal.SIGTERM, _terminate)
    broker = Broker(sasl_users=DEFAULT_SASL_USERS if args.acl else None, keep_dir=args.keep)
    try:
        broker.start()
        print(broker.bootstrap, flush=True)
        if args.acl:
            print(f"SASL_PLAINTEXT {broker.sasl_bootstrap} users: "
                  + ", ".join(f"{u}/{p}" for u, p in DEFAULT_SASL_USERS.items()), file=sys.stderr, flush=True)
        print(f"log: {broker.log_path}", file=sys.stderr, flush=True)
        while broker.proc is not None and broker.proc.poll() is None:
            time.sleep(0.5)
        print(f"the broker exited on its own; its log ends:\n{broker.log_tail()}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    except (BrokerUnavailable, BrokerError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, BrokerUnavailable) else 1
    finally:
        if args.keep and broker.dir is not None:
            print(f"kept {broker.dir}", file=sys.stderr)
        broker.stop()


if __name__ == "__main__":
    sys.exit(main())
