"""Prometheus metrics of a run, served at ``http://HOST:PORT/metrics``.

``python -m millpond.run ... --metrics-port N`` (or ``metrics_port=N`` of
``run_main``, ``cluster_main`` and ``cli_main``) serves them while the flow
runs; the server stops when the run ends. It needs the optional
``prometheus-client`` package (``pip install 'millpond[metrics]'``); this
module is imported only when a port is asked for, so a flow without one
never imports it.

Every figure is read when ``/metrics`` is scraped, by
:class:`RunCollector` on the server's thread: the engine only keeps plain
counters (per batch and per epoch, see :mod:`millpond.engine.stats`), and
nothing on its hot path takes a lock. Each run has its own
``CollectorRegistry``, so several runs in one process do not clash. The
metric names and what to alert on are in docs/operations.md.
"""

from __future__ import annotations

import logging
import socket
import threading
from socketserver import ThreadingMixIn
from typing import TYPE_CHECKING, Any, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Type
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

try:
    from prometheus_client import CollectorRegistry, ProcessCollector, make_wsgi_app
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector
except ImportError as _missing:  # pragma: no cover - exercised in a subprocess by the tests
    raise ImportError(
        "serving metrics needs the prometheus-client package, which is not installed: "
        "pip install 'millpond[metrics]'"
    ) from _missing

from millpond.engine.stats import dir_bytes
from millpond.errors import MetricsError

if TYPE_CHECKING:  # pragma: no cover
    from millpond.engine.cluster import ClusterNode
    from millpond.engine.hooks import Run
    from millpond.engine.worker import Worker

__all__ = ["MetricsServer", "RunCollector", "DEFAULT_METRICS_ADDRESS", "check_metrics_port"]

logger = logging.getLogger("millpond")

#: Where the endpoint listens unless an address is given: this machine only.
DEFAULT_METRICS_ADDRESS = "127.0.0.1"


def check_metrics_port(port: object) -> int:
    """``port`` if it is a TCP port number (0 picks a free one); raises
    ``ValueError`` (``TypeError`` for a non-int) naming the value."""
    if not isinstance(port, int) or isinstance(port, bool):
        raise TypeError(f"metrics_port must be an int from 0 to 65535, got {port!r}")
    if not 0 <= port <= 65535:
        raise ValueError(f"metrics_port must be from 0 to 65535 (0 picks a free port), got {port}")
    return port


def _url(host: str, port: int) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/metrics"


#: How often the server's loop looks for a shutdown unless woken (see
#: :meth:`MetricsServer.stop`).
_POLL_SECONDS = 0.5



class _Server(ThreadingMixIn, WSGIServer):
    """A thread per request, none of which holds up the end of the run."""

    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    """Scrapes are not logged."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        pass


def _wake(server: WSGIServer) -> None:
    """Connect to ``server`` (best effort): its loop returns from waiting."""
    host, port = server.server_address[:2]
    host = str(host)
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    try:
        socket.create_connection((host, int(port)), timeout=0.2).close()
    except OSError:
        pass


def _listen(address: str, port: int, registry: CollectorRegistry) -> WSGIServer:
    """prometheus_client's WSGI app on ``address:port`` (IPv4 or IPv6, as
    the address is); raises ``OSError`` when it cannot be listened on."""
    family = socket.getaddrinfo(address, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
    server_class: Type[_Server] = type("_Server", (_Server,), {"address_family": family})
    return make_server(address, port, make_wsgi_app(registry), server_class, handler_class=_Quiet)


class MetricsServer:
    """The ``/metrics`` endpoint of one run: its own registry, collector
    and HTTP server thread. :meth:`attach` hands it the run once the
    engine has built it; :meth:`stop` shuts the server down.

    Raises :class:`~millpond.errors.MetricsError` when the address cannot
    be listened on (in use, not this machine's).
    """

    def __init__(self, flow_id: str, port: int, address: str = DEFAULT_METRICS_ADDRESS) -> None:
        port = check_metrics_port(port)
        if not isinstance(address, str) or not address.strip():
            raise ValueError(f"metrics_address must be a host name or IP address, got {address!r}")
        self.collector = RunCollector(flow_id)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        # CPU, memory and open files of this process (read from /proc at
        # scrape time, nothing kept).
        ProcessCollector(namespace="", registry=self.registry)
        try:
            server = _listen(address, port, self.registry)
        except OSError as ex:
            raise MetricsError(f"cannot serve metrics on {address}:{port}: {ex.strerror or ex}") from ex
        self._server: Optional[WSGIServer] = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": _POLL_SECONDS},
            name="millpond-metrics", daemon=True,
        )
        self._thread.start()
        self.address = address
        self.port: int = server.server_port
        self.url = _url(address, self.port)
        logger.info("flow %r: metrics at %s", flow_id, self.url)

    def attach(self, run: "Run", workers: Sequence["Worker"], node: Optional["ClusterNode"]) -> None:
        """Serve the figures of ``run``, its ``workers`` and ``node``."""
        self.collector.attach(run, workers, node)

    def stop(self) -> None:
        """Shut the server down and wait for its thread (idempotent)."""
        server, self._server = self._server, None
        if server is None:
            return
        # shutdown() waits for the loop to look again; a connection wakes
        # it at once rather than up to _POLL_SECONDS later, at the end of
        # every run.
        stopping = threading.Thread(target=server.shutdown, name="millpond-metrics-stop", daemon=True)
        stopping.start()
        _wake(server)
        stopping.join()
        server.server_close()
        self._thread.join(timeout=5)
        logger.debug("metrics server at %s stopped", self.url)

    def __enter__(self) -> "MetricsServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _counter(name: str, doc: str, labels: Sequence[str]) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, labels=list(labels))


def _gauge(name: str, doc: str, labels: Sequence[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=list(labels))


def _buckets(cumulative: Iterable[Tuple[Optional[float], int]]) -> List[Tuple[str, float]]:
    """Prometheus ``le`` labels for ``(bound, count)`` pairs (``None`` or
    ``inf``: ``+Inf``)."""
    return [("+Inf" if b is None or b == float("inf") else repr(float(b)), float(n)) for b, n in cumulative]


class RunCollector(Collector):
    """Reads a run's figures at scrape time (see docs/operations.md).

    Before :meth:`attach` (while a recovery run restores) it reports
    nothing; a figure that cannot be read at the moment (the run closing,
    say) is left out of that scrape rather than failing it.
    """

    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        self._attached: Optional[Tuple["Run", Tuple["Worker", ...], Optional["ClusterNode"]]] = None

    def attach(self, run: "Run", workers: Sequence["Worker"], node: Optional["ClusterNode"]) -> None:
        """Report ``run``, ``workers`` and ``node`` from now on (and have
        the workers sample their source partitions' lag)."""
        for w in workers:
            w.source_lags.enabled = True
        self._attached = (run, tuple(workers), node)

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: the metrics depend on the run (registering
        then does not collect a run that is not there yet)."""
        return []

    def collect(self) -> Iterable[Metric]:
        """Every metric, read now."""
        attached = self._attached
        if attached is None:
            return []
        run, workers, node = attached
        out: List[Metric] = []
        for part in (self._workers(workers), self._recovery(run, workers), self._cluster(node)):
            try:
                out.extend(part)
            except Exception:  # noqa: BLE001 - a scrape must not fail on a figure
                logger.debug("metrics: a figure could not be read", exc_info=True)
        return out

    # -- per worker ---------------------------------------------------------

    def _workers(self, workers: Sequence["Worker"]) -> Iterator[Metric]:
        flow = self.flow_id
        items_in = _counter("millpond_step_items_in", "Items handed to a step on this worker "
                            "(before a keyed step routes them to their key's worker).", ["flow", "step", "worker"])
        items_out = _counter("millpond_step_items_out", "Items a step emitted on this worker.",
                             ["flow", "step", "worker"])
        epoch = _gauge("millpond_worker_epoch", "The epoch this worker is in.", ["flow", "worker"])
        closed = _gauge("millpond_worker_closed_epoch", "The newest epoch this worker closed.", ["flow", "worker"])
        close_s = HistogramMetricFamily(
            "millpond_epoch_close_seconds", "Seconds an epoch took to close on this worker: its snapshot and "
            "the hand-off to recovery, with any wait on back-pressure.", labels=["flow", "worker"])
        live = _gauge("millpond_live_keys", "Keyed state objects of stateful steps in memory on this worker "
                      "(what --max-live-keys bounds).", ["flow", "worker"])
        limit = _gauge("millpond_live_keys_limit", "This worker's live-key limit: --max-live-keys, or what "
                       "--max-live-bytes allows at its latest estimate, whichever is smaller.", ["flow", "worker"])
        budget = _gauge("millpond_live_bytes_limit", "This worker's --max-live-bytes.", ["flow", "worker"])
        estimate = _gauge("millpond_live_bytes", "Estimated bytes of this worker's live keyed state (with "
                          "--max-live-bytes: a sample of the keys' sizes times the live keys).", ["flow", "worker"])
        evicted = _counter("millpond_evicted_keys", "Keyed state objects evicted to the local store.",
                           ["flow", "worker"])
        hydrated = _counter("millpond_hydrated_keys", "Evicted keyed state objects read back from the local store.",
                            ["flow", "worker"])
        hydrations = _counter("millpond_hydrations", "Multi-gets that read evicted keyed state back "
                              "(millpond_hydrated_keys / this: the keys per batch).", ["flow", "worker"])
        local_bytes = _gauge("millpond_local_store_bytes", "Bytes of this worker's local store on disk "
                             "(its files, write-ahead log included).", ["flow", "worker"])
        lag = _gauge("millpond_source_lag", "How far a source partition is behind its source, as its lag() "
                     "reports it (Kafka: messages between the partition's high watermark and the next offset).",
                     ["flow", "step", "partition"])
        for w in workers:
            wl = str(w.index)
            counts = [list(ports) for ports in w.items_out]
            ins = [0] * len(counts)
            for step in w.plan.steps:
                for port, readers in enumerate(step.downs):
                    for reader, _ in readers:
                        ins[reader] += counts[step.index][port]
            for step in w.plan.steps:
                if step.kind != "input":
                    items_in.add_metric([flow, step.step_id, wl], ins[step.index])
                if step.downs:
                    items_out.add_metric([flow, step.step_id, wl], sum(counts[step.index]))
            epoch.add_metric([flow, wl], w.epoch)
            closed.add_metric([flow, wl], w.closed_epoch)
            hist = w.epoch_close
            close_s.add_metric([flow, wl], _buckets(hist.cumulative()), hist.total)
            store = w.store
            try:
                live.add_metric([flow, wl], store.evictable_count())
            except RuntimeError:  # a step registered while counting: next scrape
                pass
            max_live = store.max_live_keys
            stats = getattr(store, "live_stats", None)
            if max_live is not None:
                limit.add_metric([flow, wl], max_live)
                if stats is not None:
                    evicted.add_metric([flow, wl], stats.evicted)
                    hydrated.add_metric([flow, wl], stats.hydrated)
                    hydrations.add_metric([flow, wl], stats.hydrate_calls)
            max_bytes = getattr(store, "max_live_bytes", None)
            if max_bytes is not None:
                budget.add_metric([flow, wl], max_bytes)
                live_bytes = getattr(store, "live_bytes_estimate", None)
                if live_bytes is not None:
                    estimate.add_metric([flow, wl], live_bytes)
            path = getattr(store, "path", None)
            if path is not None:
                local_bytes.add_metric([flow, wl], dir_bytes(path.parent))
            for (step_id, name), value in w.source_lags.values.items():
                lag.add_metric([flow, step_id, name], value)
        yield from (items_in, items_out, epoch, closed, close_s, live)
        if limit.samples:
            yield from (limit, evicted, hydrated, hydrations)
        if budget.samples:
            yield budget
        if estimate.samples:
            yield estimate
        if local_bytes.samples:
            yield local_bytes
        if lag.samples:
            yield lag

    # -- recovery -----------------------------------------------------------

    def _recovery(self, run: "Run", workers: Sequence["Worker"]) -> Iterator[Metric]:
        read = getattr(run, "metrics", None)
        m: Dict[str, Any] = read() if callable(read) else {}
        if not m:
            return  # no recovery, or the run is closed
        flow = [self.flow_id]

        def counter(name: str, doc: str, value: float) -> Metric:
            c = _counter(name, doc, ["flow"])
            c.add_metric(flow, value)
            return c

        def gauge(name: str, doc: str, value: float) -> Metric:
            g = _gauge(name, doc, ["flow"])
            g.add_metric(flow, value)
            return g

        yield gauge("millpond_committed_epoch", "The newest epoch committed (where a restart resumes).",
                    m["committed_epoch"])
        yield counter("millpond_commits", "Commits this process made or learned of.", m["commits"])
        buckets = m.get("commit_latency_buckets")
        if buckets:
            h = HistogramMetricFamily("millpond_commit_latency_seconds", "Seconds from the first close of an "
                                      "epoch to its commit.", labels=["flow"])
            h.add_metric(flow, _buckets((b, n) for b, n in buckets), float(m.get("commit_latency_sum", 0.0)))
            yield h
        yield counter("millpond_commit_backpressure_seconds", "Seconds epoch closes waited for the commit "
                      "pipeline (too many epochs uploading, or compaction behind).", m["backpressure_seconds"])
        up = _counter("millpond_upload_bytes", "Bytes uploaded to the durable store, as stored (compressed).",
                      ["flow", "kind"])
        up.add_metric([self.flow_id, "segment"], m["segment_bytes"])
        up.add_metric([self.flow_id, "compacted"], m["compacted_bytes"])
        yield up
        objs = _counter("millpond_uploaded_objects", "Objects uploaded to the durable store.", ["flow", "kind"])
        objs.add_metric([self.flow_id, "segment"], m["segments_uploaded"])
        objs.add_metric([self.flow_id, "compacted"], m["compacted_uploaded"])
        yield objs
        if "upload_retries" in m:
            yield counter("millpond_upload_retries", "Failed backup calls (uploads, listings, commit records) "
                          "that were tried again.", m["upload_retries"])
        yield counter("millpond_upload_seconds", "Seconds spent uploading segments.", m["upload_seconds"])
        yield counter("millpond_snapshot_bytes", "Bytes of the snapshot segments this process cut, "
                      "before compression.", m["segment_raw_bytes"])
        for name, attr, doc in (
            ("millpond_snapshot_rows", "snapshot_rows", "Rows (writes and deletions) this worker's snapshots wrote."),
            ("millpond_snapshot_rows_copied", "snapshot_rows_copied", "Rows of this worker's whole-state "
             "snapshots copied from the keys' last pickles (untouched since) instead of packed again."),
            ("millpond_snapshot_rows_ahead", "snapshot_rows_ahead", "Rows of this worker's snapshots packed "
             "ahead, right after the key's activation, instead of at the snapshot."),
            ("millpond_snapshot_rows_carried", "snapshot_rows_carried", "Rows of this worker's whole-state "
             "snapshots that the Go core took from the state it carries (keys the epoch did not touch)."),
        ):
            per_worker = _counter(name, doc, ["flow", "worker"])
            for w in workers:
                n = getattr(w.store, attr, None)
                if isinstance(n, int):
                    per_worker.add_metric([self.flow_id, str(w.index)], n)
            yield per_worker
        yield counter("millpond_compactions", "Compactions of the durable store.", m["compactions"])
        yield counter("millpond_local_write_seconds", "Seconds the local stores spent writing snapshots "
                      "(in the background).", m["local_write_seconds"])
        execution = getattr(run, "execution", None)
        if isinstance(execution, int):
            yield gauge("millpond_execution", "This execution's number (one more per restart).", execution)
        resume_epoch = getattr(run, "resume_epoch", None)
        if isinstance(resume_epoch, int):
            yield gauge("millpond_resume_epoch", "The epoch this execution started at.", resume_epoch)
        seconds = getattr(run, "resume_seconds", None)
        if isinstance(seconds, float):
            yield gauge("millpond_resume_seconds", "Seconds this execution took to resume (read the commit "
                        "records, restore every worker's local store).", seconds)
        restores = getattr(run, "restores", None)
        if isinstance(restores, list) and restores:
            info = _gauge("millpond_resume_info", "1 per worker, labelled with how its store was restored: "
                          "fresh (nothing committed yet), fast (the local store was current) or full (rebuilt "
                          "from the durable store).", ["flow", "worker", "kind"])
            keys = _gauge("millpond_resume_keys", "Keys restored per worker (left out while the local store "
                          "may hold older versions not yet collected).", ["flow", "worker"])
            rows = _gauge("millpond_resume_rows", "Rows restored per worker.", ["flow", "worker"])
            # Restored in the order of the workers this process hosts.
            hosted = [w.index for w in workers]
            for i, r in enumerate(restores):
                worker = hosted[i] if i < len(hosted) else i
                info.add_metric([self.flow_id, str(worker), str(r.get("kind", ""))], 1)
                if int(r.get("keys", -1)) >= 0:
                    keys.add_metric([self.flow_id, str(worker)], int(r["keys"]))
                rows.add_metric([self.flow_id, str(worker)], int(r.get("rows", 0)))
            yield info
            yield rows
            if keys.samples:
                yield keys

    # -- cluster ------------------------------------------------------------

    def _cluster(self, node: Optional["ClusterNode"]) -> Iterator[Metric]:
        if node is None:
            return
        stats = node.stats()
        peers = stats.get("peers") or []
        if not peers:
            return
        blocked = _counter("millpond_exchange_backpressure_seconds", "Seconds this process stopped reading its "
                           "sources because too many bytes were queued for another process.", ["flow", "peer"])
        sent = _counter("millpond_exchange_bytes", "Bytes of exchanged items between this process and another.",
                        ["flow", "peer", "direction"])
        for p in peers:
            peer = str(p.get("peer", "?"))
            blocked.add_metric([self.flow_id, peer], float(p.get("blocked_seconds", 0.0)))
            sent.add_metric([self.flow_id, peer, "out"], p.get("bytes_out", 0))
            sent.add_metric([self.flow_id, peer, "in"], p.get("bytes_in", 0))
        yield blocked
        yield sent
