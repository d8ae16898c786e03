"""This process as one of a cluster running the same flow.

Every process of a cluster runs the same flow file with the same addresses
(``-a "h0:p;h1:p;..."``) and its own index (``-i``); process ``i`` of ``n``
hosts workers ``i*w .. i*w+w-1`` of ``n*w``. The Go core carries what
crosses processes (:mod:`gostore/mesh`): exchange batches, pickled once per
destination process and drained between activations, and the control
messages of the epoch decisions and of the commit protocol, all off the
GIL. Here are the Python halves: :class:`ClusterSettings` (what a user
configures), :class:`ClusterNode` (the core's handle),
:class:`ClusterExchange` (an :class:`~millpond.engine.exchange.Exchange`
across processes) and :class:`ClusterProgress` (an
:class:`~millpond.engine.progress.EpochProgress` decided cluster-wide).
See docs/cluster.md for the protocol.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import pickle
import re
import ssl
from collections import deque
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Deque, Dict, FrozenSet, List, Mapping, Optional, Sequence, Tuple

from millpond.engine.exchange import Message, take_all
from millpond.engine.interrupts import CoreInterrupts

if TYPE_CHECKING:  # pragma: no cover
    from types import ModuleType
from millpond.engine.plan import Plan
from millpond.engine.progress import ClusterProgress as Decision
from millpond.engine.progress import LocalProgress
from millpond.errors import ClusterError, DataflowError

__all__ = [
    "ClusterSettings",
    "ClusterNode",
    "ClusterExchange",
    "ClusterProgress",
    "flow_identity",
    "SECRET_ENV",
    "SECRET_FILE_ENV",
    "TLS_CERT_ENV",
    "TLS_KEY_ENV",
    "TLS_CA_ENV",
    "TLSFileError",
    "check_tls_files",
]

logger = logging.getLogger("millpond")

#: The shared secret every process of a cluster authenticates with.
SECRET_ENV = "MILLPOND_CLUSTER_SECRET"
#: Or a file holding it (Kubernetes secrets are mounted as files).
SECRET_FILE_ENV = "MILLPOND_CLUSTER_SECRET_FILE"
#: TLS between the processes: this process's certificate and key (PEM
#: files), and the CA that signs every process's certificate (mutual TLS).
TLS_CERT_ENV = "MILLPOND_TLS_CERT"
TLS_KEY_ENV = "MILLPOND_TLS_KEY"
TLS_CA_ENV = "MILLPOND_TLS_CA"
START_TIMEOUT_ENV = "MILLPOND_START_TIMEOUT"
PEER_TIMEOUT_ENV = "MILLPOND_PEER_TIMEOUT"
MAX_IN_FLIGHT_ENV = "MILLPOND_MAX_IN_FLIGHT_BYTES"

#: Defaults: a start timeout long enough for pods scheduled one by one, a
#: peer timeout within the ten seconds users are promised.
DEFAULT_START_TIMEOUT = timedelta(seconds=60)
DEFAULT_PEER_TIMEOUT = timedelta(seconds=10)
DEFAULT_MAX_IN_FLIGHT = 32 << 20


def _seconds_env(name: str, default: timedelta) -> timedelta:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return timedelta(seconds=value)


def _bytes_env(name: str, default: int) -> int:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of bytes, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {raw!r}")
    return value


def _secret_from_env() -> bytes:
    value = os.environ.get(SECRET_ENV, "")
    path = os.environ.get(SECRET_FILE_ENV, "")
    if value and path:
        raise ValueError(f"set {SECRET_ENV} or {SECRET_FILE_ENV}, not both")
    if path:
        try:
            data = Path(path).read_bytes().strip()
        except OSError as exc:
            raise ValueError(f"{SECRET_FILE_ENV}: cannot read {path}: {exc.strerror or exc}") from None
        if not data:
            raise ValueError(f"{SECRET_FILE_ENV}: {path} is empty")
        return data
    return value.encode()


class TLSFileError(ValueError):
    """A TLS setting that cannot be used. ``setting`` names it
    (``"tls_cert"``, ``"tls_key"`` or ``"tls_ca"``; ``None`` for a missing
    partner), ``problem`` says what is wrong with the file (``"cannot be
    read: No such file or directory"``); the message has both."""

    def __init__(self, setting: Optional[str], path: str, problem: str) -> None:
        self.setting = setting
        self.path = path
        self.problem = problem
        what = {"tls_cert": "certificate", "tls_key": "key", "tls_ca": "CA"}.get(setting or "", "")
        super().__init__(f"TLS {what} file {path} {problem}" if setting else problem)


_PEM_CERT = b"-----BEGIN CERTIFICATE-----"
_PEM_KEY = re.compile(rb"-----BEGIN ([A-Z0-9 ]*)PRIVATE KEY-----")


def _read_tls_file(setting: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise TLSFileError(setting, path, f"cannot be read: {exc.strerror or exc}") from None


def _check_certificates(setting: str, path: str) -> None:
    data = _read_tls_file(setting, path)
    if _PEM_CERT not in data:
        if _PEM_KEY.search(data):
            raise TLSFileError(
                setting, path, "holds a private key, not a certificate (are the certificate and key files swapped?)"
            )
        raise TLSFileError(setting, path, "holds no PEM certificate (-----BEGIN CERTIFICATE-----)")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
    except (ssl.SSLError, ValueError) as exc:
        raise TLSFileError(setting, path, f"holds a certificate that cannot be loaded: {exc}") from None


def check_tls_files(cert: Optional[str], key: Optional[str], ca: Optional[str]) -> None:
    """Check the TLS files of a cluster process before anything starts:
    a certificate needs its key and the other way round, a CA needs both;
    every file must be readable PEM of the right kind, and the key must
    belong to the certificate. Raises :class:`TLSFileError` naming the
    setting and the file. (The core checks the rest when the cluster
    starts: the CA signed the certificate, it is valid for this process's
    host and for both server and client use.)"""
    if not (cert or key or ca):
        return
    if cert and not key:
        raise TLSFileError(None, cert, f"the TLS certificate file {cert} is given without its key file ({TLS_KEY_ENV})")
    if key and not cert:
        raise TLSFileError(None, key, f"the TLS key file {key} is given without its certificate file ({TLS_CERT_ENV})")
    if ca and not cert:
        raise TLSFileError(
            None, ca,
            f"the TLS CA file {ca} is given without a certificate and key ({TLS_CERT_ENV}, {TLS_KEY_ENV}): "
            "with mutual TLS every process presents its own certificate, signed by that CA",
        )
    assert cert and key
    _check_certificates("tls_cert", cert)
    data = _read_tls_file("tls_key", key)
    found = _PEM_KEY.search(data)
    if found is None:
        if _PEM_CERT in data:
            raise TLSFileError(
                "tls_key", key, "holds a certificate, not a private key (are the certificate and key files swapped?)"
            )
        raise TLSFileError("tls_key", key, "holds no PEM private key (-----BEGIN PRIVATE KEY-----)")
    encrypted = TLSFileError("tls_key", key, "holds an encrypted private key: give it unencrypted (protect the file instead)")
    if found.group(1) == b"ENCRYPTED " or b"Proc-Type: 4,ENCRYPTED" in data:
        raise encrypted

    def no_password() -> str:
        raise encrypted

    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=no_password)
    except ssl.SSLError as exc:
        if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
            raise TLSFileError("tls_key", key, f"does not belong to the certificate in {cert}") from None
        raise TLSFileError("tls_key", key, f"cannot be loaded with the certificate in {cert}: {exc}") from None
    if ca:
        _check_certificates("tls_ca", ca)


def _path_env(name: str) -> Optional[str]:
    value = os.environ.get(name, "").strip()
    return value or None


def _is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]").lower()
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class ClusterSettings:
    """Where this process sits in its cluster, and the cluster's limits.

    ``secret`` authenticates every connection between processes (HMAC
    challenge–response; required unless every address is loopback);
    :meth:`from_env` reads it from ``MILLPOND_CLUSTER_SECRET`` or the file
    ``MILLPOND_CLUSTER_SECRET_FILE`` names. ``peer_timeout`` bounds how long
    a process that died or stopped answering goes unnoticed;
    ``start_timeout``, how long the processes have to come up.
    ``max_in_flight_bytes`` bounds the batches queued for one peer before
    this process stops reading its sources. ``tls_cert`` and ``tls_key``
    (PEM files) turn on TLS between the processes; ``tls_ca`` (the CA that
    signs every process's certificate) makes it mutual: each process
    checks the other's certificate against it (docs/cluster.md).
    """

    addresses: Tuple[str, ...]
    index: int
    secret: bytes = field(default=b"", repr=False)
    start_timeout: timedelta = DEFAULT_START_TIMEOUT
    peer_timeout: timedelta = DEFAULT_PEER_TIMEOUT
    max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT
    tls_cert: Optional[str] = None
    tls_key: Optional[str] = None
    tls_ca: Optional[str] = None

    def __post_init__(self) -> None:
        n = len(self.addresses)
        if n == 0:
            raise ValueError("a cluster needs at least one address")
        if not isinstance(self.index, int) or not 0 <= self.index < n:
            raise ValueError(
                f"process id {self.index!r} is out of range for {n} addresses (process ids start at 0)"
            )
        seen: Dict[str, int] = {}
        for i, a in enumerate(self.addresses):
            # Host names are case-insensitive (as the core compares them).
            folded = a.lower()
            if folded in seen:
                raise ValueError(
                    f"address {a} is given twice (processes {seen[folded]} and {i}); every process needs its own"
                )
            seen[folded] = i
        if n > 1 and not self.secret:
            remote = [a for a in self.addresses if not _is_loopback(a)]
            if remote:
                what = f"addresses {', '.join(remote)} are" if len(remote) > 1 else f"address {remote[0]} is"
                raise ValueError(
                    f"{what} not loopback: set a cluster secret "
                    f"({SECRET_ENV} or {SECRET_FILE_ENV}) so processes can tell their peers from strangers"
                )
        if n > 1:
            check_tls_files(self.tls_cert, self.tls_key, self.tls_ca)

    @property
    def count(self) -> int:
        """The number of processes."""
        return len(self.addresses)

    @classmethod
    def from_env(
        cls,
        addresses: Sequence[str],
        index: int,
        *,
        tls_cert: Optional[str] = None,
        tls_key: Optional[str] = None,
        tls_ca: Optional[str] = None,
    ) -> "ClusterSettings":
        """Settings for ``addresses``/``index`` with the secret, timeouts
        and TLS files from the environment (``MILLPOND_CLUSTER_SECRET[_FILE]``,
        ``MILLPOND_START_TIMEOUT``, ``MILLPOND_PEER_TIMEOUT`` in seconds,
        ``MILLPOND_MAX_IN_FLIGHT_BYTES``, ``MILLPOND_TLS_CERT``,
        ``MILLPOND_TLS_KEY``, ``MILLPOND_TLS_CA``); a TLS file given here
        overrides its variable."""
        return cls(
            tuple(addresses), index, _secret_from_env(),
            _seconds_env(START_TIMEOUT_ENV, DEFAULT_START_TIMEOUT),
            _seconds_env(PEER_TIMEOUT_ENV, DEFAULT_PEER_TIMEOUT),
            _bytes_env(MAX_IN_FLIGHT_ENV, DEFAULT_MAX_IN_FLIGHT),
            tls_cert=tls_cert or _path_env(TLS_CERT_ENV),
            tls_key=tls_key or _path_env(TLS_KEY_ENV),
            tls_ca=tls_ca or _path_env(TLS_CA_ENV),
        )


def flow_identity(
    plan: Plan, workers_per_process: int, key_group_count: int, recovery: str, epoch_interval: timedelta
) -> Dict[str, str]:
    """What every process of a cluster must agree on, by name: a process
    that differs is refused at start with the name and both values."""
    wiring = [(s.step_id, s.kind, s.downs) for s in plan.steps]
    digest = hashlib.sha256(repr(wiring).encode()).hexdigest()[:16]
    return {
        "flow_id": plan.flow_id,
        "steps": ",".join(s.step_id for s in plan.steps),
        "wiring": digest,
        "workers_per_process": str(workers_per_process),
        "key_group_count": str(key_group_count),
        "recovery": recovery,
        "epoch_interval": str(epoch_interval.total_seconds()),
    }


def _load_core() -> "ModuleType":
    # Imported when a cluster starts: a one-process flow without recovery
    # runs without the Go extension.
    from millpond import _core

    return _core


class ClusterNode:
    """This process's connection to the others (the core's handle)."""

    def __init__(self, settings: ClusterSettings, identity: Mapping[str, str]) -> None:
        self._core = _core = _load_core()
        self.settings = settings
        self.index = settings.index
        self.count = settings.count
        opts = {
            "index": settings.index,
            "addresses": list(settings.addresses),
            "identity": dict(identity),
            "start_timeout_seconds": settings.start_timeout.total_seconds(),
            "peer_timeout_seconds": settings.peer_timeout.total_seconds(),
            "max_in_flight_bytes": settings.max_in_flight_bytes,
            "inbox_limit_bytes": settings.max_in_flight_bytes,
            "tls_cert": settings.tls_cert or "",
            "tls_key": settings.tls_key or "",
            "tls_ca": settings.tls_ca or "",
        }
        tls = " over mutual TLS" if settings.tls_ca else " over TLS" if settings.tls_cert else ""
        logger.info(
            "process %d of %d: joining the cluster at %s%s",
            settings.index, settings.count, settings.addresses[settings.index], tls,
        )
        # Ctrl-C must stop a start that waits for peers that never come.
        self._interrupts = CoreInterrupts()
        self._interrupts.start()
        try:
            self.handle: Optional[int] = _core.cluster_open(json.dumps(opts), settings.secret)
        except BaseException:
            self._interrupts.stop()
            raise
        logger.info("process %d: every process of the cluster is connected", settings.index)

    def _h(self) -> int:
        if self.handle is None:
            raise ClusterError("the cluster connection is closed")
        return self.handle

    def send(self, process: int, data: bytes) -> None:
        self._core.cluster_send(self._h(), process, data)

    def drain(self) -> List[Tuple[int, bytes]]:
        out: List[Tuple[int, bytes]] = self._core.cluster_drain(self._h())
        return out

    def wait(self, seconds: float) -> None:
        self._core.cluster_wait(self._h(), max(seconds, 0.0))

    def congested(self) -> bool:
        return bool(self._core.cluster_congested(self._h()))

    def report(self, epoch: int, phase: int, ready: bool, done: FrozenSet[int]) -> Optional[FrozenSet[int]]:
        out = self._core.cluster_report(self._h(), epoch, phase, ready, json.dumps(sorted(done)))
        return None if out is None else frozenset(out)

    def stats(self) -> Dict[str, Any]:
        if self.handle is None:
            return {}
        out: Dict[str, Any] = self._core.cluster_stats(self.handle)
        return out

    def close(self) -> None:
        """Leave the cluster in good order (peers do not report us lost)."""
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                self._core.cluster_close(handle)
            finally:
                self._interrupts.stop()

    def abort(self, reason: str) -> None:
        """Leave the cluster because this process failed: every peer stops
        at once with ``process I (ADDR) lost: <reason>``."""
        handle, self.handle = self.handle, None
        if handle is not None:
            try:
                self._core.cluster_abort(handle, reason)
            except ClusterError:
                logger.debug("leaving a failed cluster", exc_info=True)
            finally:
                self._interrupts.stop()


class ClusterExchange:
    """Routes item batches to workers in this process and in the others.

    Batches for another process are pickled together, once per process
    per :meth:`flush`, and handed to the core, which never blocks the
    caller (:meth:`congested` is the back-pressure signal). Received
    batches of a later epoch than this process's (a faster peer moved on)
    are held until this process reaches that epoch.
    """

    def __init__(self, node: ClusterNode, first_worker: int, workers: int) -> None:
        self._node = node
        self._first = first_worker
        self._per_process = workers
        self._inboxes: Dict[int, Deque[Message]] = {
            w: deque() for w in range(first_worker, first_worker + workers)
        }
        self._out: Dict[int, List[Tuple[int, int, int, int, List[Any]]]] = {}
        self._held: List[Tuple[int, Message]] = []
        self._sent = 0
        self._received = 0
        self.epoch = 0

    def send(self, to_worker: int, message: Message) -> None:
        box = self._inboxes.get(to_worker)
        if box is not None:
            box.append(message)
            # Only this process's own deliveries: the core counts what
            # crosses processes.
            self._sent += 1
        else:
            self._out.setdefault(to_worker // self._per_process, []).append(
                (to_worker, message.step, message.port, message.epoch, message.items)
            )

    def flush(self) -> None:
        """Hand what was sent to other processes since the last flush to the core."""
        if not self._out:
            return
        out, self._out = self._out, {}
        for process, batch in out.items():
            try:
                data = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
            except Exception as ex:
                raise DataflowError(
                    f"items sent to process {process} could not be pickled: {type(ex).__name__}: {ex}; "
                    "items that cross processes (keyed steps, redistribute, partitioned sinks) must be picklable"
                ) from ex
            self._node.send(process, data)

    def _pull(self) -> None:
        for _sender, data in self._node.drain():
            for to_worker, step, port, epoch, items in pickle.loads(data):
                msg = Message(step, port, epoch, items)
                if epoch > self.epoch:
                    self._held.append((to_worker, msg))
                else:
                    self._inboxes[to_worker].append(msg)
                    self._sent += 1

    def begin_epoch(self, epoch: int) -> None:
        """This process moved to ``epoch``: release what was held for it."""
        self.epoch = epoch
        if self._held:
            keep: List[Tuple[int, Message]] = []
            for to_worker, msg in self._held:
                if msg.epoch <= epoch:
                    self._inboxes[to_worker].append(msg)
                    self._sent += 1
                else:
                    keep.append((to_worker, msg))
            self._held = keep

    def receive(self, worker: int) -> List[Message]:
        self._pull()
        out = take_all(self._inboxes[worker])
        self._received += len(out)
        return out

    def pending(self) -> bool:
        return bool(self._out) or any(self._inboxes.values())

    def counts(self) -> Tuple[int, int]:
        # Batches put in an inbox: this process's own and those released
        # from other processes (the core counts what crossed processes
        # for the cluster's decision; these say whether every inbox here
        # was taken).
        return (self._sent, self._received)

    def congested(self) -> bool:
        return self._node.congested()


class ClusterProgress:
    """Epoch decisions taken by the whole cluster (Mattern's four-counter
    method in the core, led by process 0; see docs/cluster.md)."""

    def __init__(self, node: ClusterNode) -> None:
        self._node = node

    def report(self, local: LocalProgress) -> Optional[Decision]:
        if local.sent != local.received:
            # Batches of this process still queued here: take them first.
            return Decision(local.epoch, False, local.done_inputs)
        done = self._node.report(local.epoch, local.phase, local.ready, local.done_inputs)
        if done is None:
            return None
        return Decision(local.epoch, True, done)
