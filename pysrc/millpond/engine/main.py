"""The entry points that run a flow in this process: :func:`run_main` and
:func:`cluster_main`, shaped as Bytewax's are (``millpond.testing``
re-exports both, where Bytewax users import them from).

>>> import millpond.operators as op
>>> from millpond.dataflow import Dataflow
>>> from millpond.testing import TestingSink, TestingSource
>>> flow = Dataflow("doc")
>>> out = []
>>> op.output("out", op.map("inc", op.input("in", flow, TestingSource([1, 2])), lambda x: x + 1),
...           TestingSink(out))
>>> run_main(flow)
>>> out
[2, 3]
"""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

from millpond.dataflow import Dataflow
from millpond.engine.cluster import ClusterSettings
from millpond.engine.driver import execute

if TYPE_CHECKING:  # pragma: no cover
    from millpond.metrics import MetricsServer
    from millpond.recovery import RecoveryConfig

__all__ = ["run_main", "cluster_main"]


def run_main(
    flow: Dataflow,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional["RecoveryConfig"] = None,
    max_live_keys: Optional[int] = None,
    metrics_port: Optional[int] = None,
    metrics_address: str = "127.0.0.1",
    max_live_bytes: Optional[int] = None,
) -> None:
    """Run ``flow`` on one worker in the calling thread until its input ends.

    ``epoch_interval`` defaults to 10 seconds; ``recovery_config`` (a
    ``millpond.recovery.RecoveryConfig``) turns recovery on.
    ``max_live_keys`` bounds the keyed state objects kept in memory: colder
    ones are evicted to the local store (a temporary directory without
    recovery) and read back when touched; ``None`` takes the recovery
    config's, else ``MILLPOND_MAX_LIVE_KEYS``, else no bound.
    ``max_live_bytes`` bounds them by their estimated size instead (or as
    well: the tighter bound wins), measured on a sample of the live keys
    (docs/recovery.md, "A byte budget"); ``None`` takes the recovery
    config's, else ``MILLPOND_MAX_LIVE_BYTES``, else no budget.
    ``metrics_port`` serves Prometheus metrics at
    ``http://METRICS_ADDRESS:PORT/metrics`` while the flow runs (0 picks a
    free port; the address is logged); it needs ``prometheus-client``
    (``pip install 'millpond[metrics]'``), else ``ImportError``. See
    docs/operations.md. Exceptions from user code arrive as
    ``millpond.errors.DataflowError``; ``ValueError`` for a flow without
    input or output, or a limit or budget below 1; ``MetricsError`` when the metrics
    address cannot be listened on.
    """
    with serve_metrics(flow, metrics_port, metrics_address) as metrics:
        execute(
            flow, worker_count=1, epoch_interval=epoch_interval, recovery_config=recovery_config,
            max_live_keys=max_live_keys, max_live_bytes=max_live_bytes, metrics=metrics,
        )


@contextmanager
def serve_metrics(flow: Dataflow, port: Optional[int], address: str = "127.0.0.1") -> Iterator[Optional["MetricsServer"]]:
    """Serve ``flow``'s metrics on ``address:port`` for the ``with`` block
    (nothing, and no import of ``prometheus_client``, when ``port`` is
    ``None``); the server is shut down when the block ends, however it
    ends. Raises ``ImportError`` naming the extra to install when
    ``prometheus-client`` is missing, ``ValueError``/``TypeError`` for a
    bad port or address, ``MetricsError`` when it cannot be listened on."""
    if port is None:
        yield None
        return
    from millpond.metrics import MetricsServer

    if not isinstance(flow, Dataflow):
        raise TypeError(f"flow must be a millpond.dataflow.Dataflow, got {type(flow).__name__}")
    server = MetricsServer(flow.flow_id, port, address)
    try:
        yield server
    finally:
        server.stop()


def cluster_main(
    flow: Dataflow,
    addresses: Optional[Sequence[str]],
    proc_id: int,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional["RecoveryConfig"] = None,
    worker_count_per_proc: int = 1,
    tls_cert: Optional[str] = None,
    tls_key: Optional[str] = None,
    tls_ca: Optional[str] = None,
    max_live_keys: Optional[int] = None,
    metrics_port: Optional[int] = None,
    metrics_address: str = "127.0.0.1",
    max_live_bytes: Optional[int] = None,
) -> None:
    """Run ``flow`` as process ``proc_id`` of a cluster, with
    ``worker_count_per_proc`` workers here.

    Every process of the cluster calls this with the same flow, the same
    ``addresses`` (``"host:port"`` of every process, in process-id order)
    and its own ``proc_id``; process ``i`` hosts workers
    ``i*w .. i*w+w-1``. Keyed items go to the worker that owns their key,
    whichever process it is in, so results are the same for any worker
    and process count. ``addresses=[]`` (or one address) runs one process.
    Processes authenticate each other with ``MILLPOND_CLUSTER_SECRET`` (or
    the file ``MILLPOND_CLUSTER_SECRET_FILE`` names), required unless
    every address is loopback; ``MILLPOND_START_TIMEOUT`` and
    ``MILLPOND_PEER_TIMEOUT`` (seconds) bound the start and the detection
    of a lost process. ``tls_cert`` and ``tls_key`` (PEM files; default
    ``MILLPOND_TLS_CERT``, ``MILLPOND_TLS_KEY``) turn on TLS between the
    processes, ``tls_ca`` (``MILLPOND_TLS_CA``) mutual TLS: every process
    then needs a certificate signed by that CA (docs/cluster.md).
    ``max_live_keys`` and ``max_live_bytes`` bound each worker's live
    keyed state as in :func:`run_main`. ``metrics_port`` and ``metrics_address`` serve this
    process's metrics as in :func:`run_main`: every process serves its
    own (processes that share a host need different ports). Raises
    ``ValueError`` for settings wrong in themselves (a TLS file that cannot
    be used, say), before anything starts; ``ClusterError`` when the
    cluster cannot start or a process is lost; run the whole cluster again
    to resume.
    """
    addrs = list(addresses or [])
    if not isinstance(worker_count_per_proc, int) or worker_count_per_proc < 1:
        raise ValueError(
            f"worker_count_per_proc must be a positive int; got {worker_count_per_proc!r}"
        )
    if len(addrs) <= 1:
        if proc_id != 0:
            raise ValueError(f"proc_id must be 0 for a one-process cluster; got {proc_id!r}")
        settings = None
    else:
        settings = ClusterSettings.from_env(addrs, proc_id, tls_cert=tls_cert, tls_key=tls_key, tls_ca=tls_ca)
    with serve_metrics(flow, metrics_port, metrics_address) as metrics:
        execute(
            flow,
            worker_count=worker_count_per_proc,
            epoch_interval=epoch_interval,
            recovery_config=recovery_config,
            cluster=settings,
            max_live_keys=max_live_keys,
            max_live_bytes=max_live_bytes,
            metrics=metrics,
        )
