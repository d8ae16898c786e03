"""The epoch loop of one process: cooperative workers in one thread.

All workers of the process are stepped round-robin by the calling thread,
which keeps execution deterministic and simple; more cores come from more
processes (a cluster, :mod:`millpond.engine.cluster`), each running this
same loop in lockstep with the others. Epochs run in lockstep: every
source partition emits into the current epoch until it closes (the interval
elapsed, every batch with a zero interval, or all inputs ended); then
the exchange is drained, steps whose inputs all ended get their EOF in
topological order, and every worker closes the epoch (outputs are already
written; positions are recorded; recovery snapshots the store).
"""

from __future__ import annotations

import logging
import time
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, FrozenSet, List, Optional

from millpond.dataflow import Dataflow
from millpond.engine.clock import Clock, SystemClock
from millpond.engine.exchange import Exchange, LocalExchange
from millpond.engine.hooks import Run, open_run
from millpond.engine.plan import Plan, compile_plan
from millpond.engine.cluster import ClusterExchange, ClusterNode, ClusterProgress, ClusterSettings, flow_identity
from millpond.engine.pygc import flow_gc, young_threshold
from millpond.engine.progress import EpochProgress, LocalProgress, SingleProcessProgress
from millpond.engine.worker import Worker
from millpond.errors import AbortExecution
from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT
from millpond.livelimit import LiveLimit, resolve_live_limit

if TYPE_CHECKING:  # pragma: no cover
    from millpond.metrics import MetricsServer
    from millpond.recovery import RecoveryConfig

__all__ = ["execute", "DEFAULT_EPOCH_INTERVAL"]

logger = logging.getLogger("millpond")

#: Epoch length when the caller gives none.
DEFAULT_EPOCH_INTERVAL = timedelta(seconds=10)

# With nothing to do and a partition that wants polling again at once, wait
# this long rather than spin (the machine is shared).
_IDLE_POLL_SECONDS = 0.001
# How often the epoch loop asks whether an epoch committed, when a
# two-phase sink waits to publish one.
_COMMIT_POLL_SECONDS = 0.02


def _check_interval(epoch_interval: Optional[timedelta]) -> timedelta:
    if epoch_interval is None:
        return DEFAULT_EPOCH_INTERVAL
    if not isinstance(epoch_interval, timedelta):
        raise TypeError(
            f"epoch_interval must be a datetime.timedelta; got "
            f"{type(epoch_interval).__name__}: {epoch_interval!r}"
        )
    if epoch_interval < timedelta(0):
        raise ValueError(f"epoch_interval must not be negative; got {epoch_interval}")
    return epoch_interval


def execute(
    flow: Dataflow,
    *,
    worker_count: int = 1,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional["RecoveryConfig"] = None,
    clock: Optional[Clock] = None,
    progress: Optional[EpochProgress] = None,
    cluster: Optional[ClusterSettings] = None,
    max_live_keys: Optional[int] = None,
    metrics: Optional["MetricsServer"] = None,
    max_live_bytes: Optional[int] = None,
) -> None:
    """Run ``flow`` to the end of its input with ``worker_count`` workers
    in this process (and as many in every other process of ``cluster``).

    ``max_live_keys`` bounds each worker's live state objects, and
    ``max_live_bytes`` their estimated bytes; ``None`` takes the recovery
    config's field of that name, else the variable
    ``MILLPOND_MAX_LIVE_KEYS`` / ``MILLPOND_MAX_LIVE_BYTES``, else no
    bound. ``metrics``, a serving
    :class:`~millpond.metrics.MetricsServer`, is handed the run once its
    workers are built (the caller stops it).

    Returns normally at EOF and after ``TestingSource.ABORT()``; raises
    ``DataflowError`` for an exception in user code, ``ClusterError`` when
    the cluster failed, and lets ``KeyboardInterrupt`` through. Committed
    epochs are intact in every case.
    """
    plan = compile_plan(flow)
    interval = _check_interval(epoch_interval)
    live_limit = resolve_live_limit(max_live_keys, max_live_bytes, recovery_config)
    gc_threshold = young_threshold()
    if not isinstance(worker_count, int) or worker_count < 1:
        raise ValueError(f"worker count must be a positive int; got {worker_count!r}")
    clock = clock or SystemClock()
    node: Optional[ClusterNode] = None
    if cluster is not None and cluster.count > 1:
        kgc = recovery_config.key_group_count if recovery_config is not None else DEFAULT_KEY_GROUP_COUNT
        identity = flow_identity(
            plan, worker_count, kgc, "on" if recovery_config is not None else "off", interval
        )
        node = ClusterNode(cluster, identity)
    try:
        with flow_gc(gc_threshold):
            finished = _execute(
                plan, worker_count, interval, recovery_config, clock, progress, node, live_limit, metrics
            )
    except BaseException as ex:
        if node is not None:
            node.abort(f"{type(ex).__name__}: {ex}"[:300])
        raise
    if node is not None:
        if finished:
            node.close()
        else:
            # Stopped early (a source aborted, as a crash would): the other
            # processes must stop too, not wait for this one.
            node.abort("the execution was aborted by its source")


def _execute(
    plan: Plan,
    workers_here: int,
    interval: timedelta,
    recovery_config: Optional["RecoveryConfig"],
    clock: Clock,
    progress: Optional[EpochProgress],
    node: Optional[ClusterNode],
    live_limit: LiveLimit = LiveLimit(),
    metrics: Optional["MetricsServer"] = None,
) -> bool:
    """Run the epochs; True if the inputs ended (False: aborted)."""
    first = node.index * workers_here if node is not None else 0
    total = workers_here * (node.count if node is not None else 1)
    hosted = range(first, first + workers_here)
    exchange: Exchange
    if node is not None:
        exchange = ClusterExchange(node, first, workers_here)
        progress = progress or ClusterProgress(node)
    else:
        exchange = LocalExchange(workers_here)
        progress = progress or SingleProcessProgress()
    run = open_run(recovery_config, plan.flow_id, total, hosted, node, live_limit)
    workers: List[Worker] = []
    loop: Optional[_EpochLoop] = None
    aborted = True
    try:
        kgc = run.key_group_count
        started = time.monotonic()
        for w in hosted:
            workers.append(Worker(w, total, plan, run, exchange, kgc, clock, run.resume_epoch))
        if metrics is not None:
            metrics.attach(run, workers, node)
        where = f" (workers {first}-{first + workers_here - 1} of {total})" if node is not None else ""
        logger.info(
            "flow %r: execution %d starts at epoch %d with %d worker(s)%s (setup %.3fs)",
            plan.flow_id,
            run.execution,
            run.resume_epoch,
            workers_here,
            where,
            time.monotonic() - started,
        )
        loop = _EpochLoop(plan, workers, exchange, progress, clock, interval, node, run)
        try:
            last = loop.run(run.resume_epoch)
        except AbortExecution:
            logger.info("flow %r: execution %d aborted by its source", plan.flow_id, run.execution)
        else:
            logger.info("flow %r: input ended; last epoch %d", plan.flow_id, last)
            aborted = False
        finally:
            loop.log_summary()
            for worker in workers:
                worker.log_live_stats()
    finally:
        closed = False
        try:
            run.finish(aborted)
            # Every closed epoch is committed now: two-phase sinks publish
            # the last ones before their partitions close.
            if loop is not None:
                try:
                    loop.publish_commits(force=True)
                except Exception:
                    if not aborted:
                        raise
                    # The run already fails or aborts: that error stands.
                    logger.warning("publishing committed epochs after the run stopped failed", exc_info=True)
            if not aborted:
                closed = True
                for worker in workers:
                    worker.close()
        finally:
            try:
                if not closed:
                    for worker in workers:
                        try:
                            worker.close()
                        except Exception:  # already failing or aborting
                            logger.debug("error closing partitions after abort", exc_info=True)
            finally:
                run.close()
    return not aborted


def _drain(workers: List[Worker], exchange: Exchange, now: datetime) -> None:
    while True:
        did = False
        for worker in workers:
            if worker.pump(now, False):
                did = True
        exchange.flush()
        if not did and not exchange.pending():
            return


class _EpochLoop:
    """The epochs of one process, in lockstep with the rest of its cluster.

    Within an epoch, sources are polled and batches processed until the
    process is ready to close it (the interval elapsed, a batch was
    emitted with a zero interval, or its inputs ended). From then on it is
    passive: no more polling, no timers, only batches it receives are
    processed, until the cluster decides that every process is ready and
    nothing is in flight (phase 0). Steps whose inputs ended everywhere
    then get their end of input, each followed by one more such decision
    (phases 1, 2, ...), so what their ``on_eof`` sent arrives before any
    process snapshots. With one process the decisions are immediate.
    """

    def __init__(
        self,
        plan: Plan,
        workers: List[Worker],
        exchange: Exchange,
        progress: EpochProgress,
        clock: Clock,
        interval: timedelta,
        node: Optional[ClusterNode],
        run: Run,
    ) -> None:
        self.plan = plan
        self._run = run
        # Two-phase sinks hear of commits: the newest epoch they were told
        # of, the newest closed, and when to ask the run again.
        self._publishes = any(w.outputs for w in workers)
        self._told = 0
        self._closed = 0
        self._next_check = 0.0
        self.workers = workers
        self.exchange = exchange
        self.progress = progress
        self.clock = clock
        self.seconds = interval.total_seconds()
        self.node = node
        # Waiting on the cluster wakes at once when a batch or a decision
        # arrives; that needs the real clock the core's waits run on.
        self._wait = node.wait if node is not None and isinstance(clock, SystemClock) else clock.sleep
        self.settle_seconds = 0.0
        self.epochs = 0

    def _local_done(self) -> FrozenSet[int]:
        done = [w.inputs_done() for w in self.workers]
        return frozenset.intersection(*done) if done else frozenset()

    def run(self, epoch: int) -> int:
        plan, workers, exchange, clock = self.plan, self.workers, self.exchange, self.clock
        all_inputs = frozenset(plan.input_indexes)
        done_inputs: FrozenSet[int] = frozenset()
        ended_steps: set[int] = set()
        while True:
            for worker in workers:
                worker.epoch = epoch
            exchange.begin_epoch(epoch)
            deadline = clock.monotonic() + self.seconds
            ready = False
            while True:
                now = clock.now()
                emitted = False
                if not ready:
                    for worker in workers:
                        worker.fire_timers(now)  # due timers before new input
                if not ready and not exchange.congested():
                    for worker in workers:
                        if worker.poll_inputs(now):
                            emitted = True
                for worker in workers:
                    worker.pump(now, not ready)
                _drain(workers, exchange, now)
                local_done = self._local_done()
                if not ready:
                    ready = (
                        local_done == all_inputs
                        or (self.seconds == 0 and emitted)
                        or clock.monotonic() >= deadline
                    )
                if self._publishes:
                    self.publish_commits()
                sent, received = exchange.counts()
                decision = self.progress.report(LocalProgress(epoch, ready, sent, received, local_done))
                if decision is not None and decision.close:
                    break
                if ready:
                    self._wait(0.05)
                elif not emitted:
                    self._idle(deadline)
            newly = decision.done_inputs - done_inputs
            phase = 0
            if newly:
                done_inputs = done_inputs | newly
                for step in plan.steps:
                    if (
                        step.kind == "stateful_batch"
                        and step.index not in ended_steps
                        and step.input_ancestors <= done_inputs
                    ):
                        ended_steps.add(step.index)
                        now = clock.now()
                        for worker in workers:
                            worker.upstream_eof(step.index, now)
                        _drain(workers, exchange, now)
                        phase += 1
                        self._settle(epoch, phase)
            last = done_inputs == all_inputs
            for worker in workers:
                worker.snapshot_epoch(epoch)
            for worker in workers:
                worker.close_epoch(epoch, last)
            self._closed = epoch
            if self._publishes:
                self.publish_commits(force=True)
            self.epochs += 1
            logger.debug("flow %r: closed epoch %d", plan.flow_id, epoch)
            if last:
                return epoch
            epoch += 1

    def publish_commits(self, force: bool = False) -> None:
        """Tell two-phase sinks of epochs committed since the last call.

        Asks the run at most every ``_COMMIT_POLL_SECONDS`` unless
        ``force``."""
        if not self._publishes:
            return
        now = time.monotonic()
        if not force and now < self._next_check:
            return
        self._next_check = now + _COMMIT_POLL_SECONDS
        committed = self._run.committed_epoch()
        if committed > self._told:
            self._told = committed
            for worker in self.workers:
                worker.epochs_committed(committed)

    def _settle(self, epoch: int, phase: int) -> None:
        """Process received batches until the cluster decides that nothing
        of ``epoch`` is in flight any more."""
        started = time.monotonic()
        while True:
            now = self.clock.now()
            _drain(self.workers, self.exchange, now)
            sent, received = self.exchange.counts()
            decision = self.progress.report(
                LocalProgress(epoch, True, sent, received, self._local_done(), phase)
            )
            if decision is not None and decision.close:
                break
            self._wait(0.05)
        self.settle_seconds += time.monotonic() - started

    def _idle(self, deadline: float) -> None:
        """Sleep until a partition or timer wants to run, or the epoch ends."""
        wait = deadline - self.clock.monotonic()
        wakes = [t for t in (w.next_wake() for w in self.workers) if t is not None]
        if wakes:
            until = (min(wakes) - self.clock.now()).total_seconds()
            wait = min(wait, until)
        if self._publishes and self._told < self._closed:
            # A closed epoch waits to be published once committed.
            wait = min(wait, _COMMIT_POLL_SECONDS)
        self._wait(max(wait, _IDLE_POLL_SECONDS))

    def log_summary(self) -> None:
        """Log what crossed processes (cluster runs only)."""
        if self.node is None:
            return
        stats = self.node.stats()
        for peer in stats.get("peers") or []:
            logger.info(
                "process %d -> process %d (%s): %d batches / %d bytes out, %d batches / %d bytes in, "
                "%.3f s blocked on back-pressure",
                self.node.index, peer.get("peer", -1), peer.get("address", "?"),
                peer.get("frames_out", 0), peer.get("bytes_out", 0), peer.get("frames_in", 0),
                peer.get("bytes_in", 0), peer.get("blocked_seconds", 0.0),
            )
        prog = stats.get("progress") or {}
        if prog.get("leader"):
            logger.info(
                "process %d: %d epoch decisions in %d waves; epoch close across the cluster p50 %.3f s p99 %.3f s, "
                "settling (all ready -> decided) p50 %.4f s p99 %.4f s",
                self.node.index, prog.get("decisions", 0), prog.get("waves", 0),
                prog.get("close_p50_seconds", 0.0), prog.get("close_p99_seconds", 0.0),
                prog.get("settle_p50_seconds", 0.0), prog.get("settle_p99_seconds", 0.0),
            )
