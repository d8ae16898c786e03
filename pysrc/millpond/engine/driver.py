"""The epoch loop of one process: cooperative workers in one thread.

All workers of the process are stepped round-robin by the calling thread,
which keeps execution deterministic and simple. Epochs run in lockstep: every
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
from millpond.engine.progress import EpochProgress, LocalProgress, SingleProcessProgress
from millpond.engine.worker import Worker
from millpond.errors import AbortExecution

if TYPE_CHECKING:  # pragma: no cover
    from millpond.recovery import RecoveryConfig

__all__ = ["execute", "DEFAULT_EPOCH_INTERVAL"]

logger = logging.getLogger("millpond")

#: Epoch length when the caller gives none.
DEFAULT_EPOCH_INTERVAL = timedelta(seconds=10)

# With nothing to do and a partition that wants polling again at once, wait
# this long rather than spin (the machine is shared).
_IDLE_POLL_SECONDS = 0.001


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
) -> None:
    """Run ``flow`` to the end of its input with ``worker_count`` workers.

    Returns normally at EOF and after ``TestingSource.ABORT()``; raises
    ``DataflowError`` for an exception in user code and lets
    ``KeyboardInterrupt`` through. Committed epochs are intact in every case.
    """
    plan = compile_plan(flow)
    interval = _check_interval(epoch_interval)
    if not isinstance(worker_count, int) or worker_count < 1:
        raise ValueError(f"worker count must be a positive int; got {worker_count!r}")
    clock = clock or SystemClock()
    progress = progress or SingleProcessProgress()
    run = open_run(recovery_config, plan.flow_id, worker_count)
    workers: List[Worker] = []
    aborted = True
    try:
        exchange = LocalExchange(worker_count)
        kgc = run.key_group_count
        started = time.monotonic()
        for w in range(worker_count):
            workers.append(
                Worker(w, worker_count, plan, run, exchange, kgc, clock, run.resume_epoch)
            )
        logger.info(
            "flow %r: execution %d starts at epoch %d with %d worker(s) (setup %.3fs)",
            plan.flow_id,
            run.execution,
            run.resume_epoch,
            worker_count,
            time.monotonic() - started,
        )
        try:
            last = _epoch_loop(plan, workers, exchange, progress, clock, interval, run)
        except AbortExecution:
            logger.info("flow %r: execution %d aborted by its source", plan.flow_id, run.execution)
        else:
            logger.info("flow %r: input ended; last epoch %d", plan.flow_id, last)
            aborted = False
            for worker in workers:
                worker.close()
    finally:
        try:
            run.finish(aborted)
        finally:
            try:
                if aborted:
                    for worker in workers:
                        try:
                            worker.close()
                        except Exception:  # already failing or aborting
                            logger.debug("error closing partitions after abort", exc_info=True)
            finally:
                run.close()


def _drain(workers: List[Worker], exchange: Exchange, now: datetime) -> None:
    while True:
        did = False
        for worker in workers:
            if worker.pump(now, False):
                did = True
        if not did and not exchange.pending():
            return


def _epoch_loop(
    plan: Plan,
    workers: List[Worker],
    exchange: Exchange,
    progress: EpochProgress,
    clock: Clock,
    interval: timedelta,
    run: Run,
) -> int:
    all_inputs = frozenset(plan.input_indexes)
    seconds = interval.total_seconds()
    done_inputs: FrozenSet[int] = frozenset()
    ended_steps: set[int] = set()
    epoch = run.resume_epoch
    while True:
        for worker in workers:
            worker.epoch = epoch
        deadline = clock.monotonic() + seconds
        while True:
            now = clock.now()
            emitted = False
            for worker in workers:
                if worker.poll_inputs(now):
                    emitted = True
            for worker in workers:
                worker.pump(now, True)
            _drain(workers, exchange, now)
            local_done = frozenset().union(*(w.inputs_done() for w in workers))
            local_done = frozenset(
                i for i in local_done if all(i in w.inputs_done() for w in workers)
            )
            ready = (
                local_done == all_inputs
                or (seconds == 0 and emitted)
                or clock.monotonic() >= deadline
            )
            sent, received = exchange.counts()
            decision = progress.report(LocalProgress(epoch, ready, sent, received, local_done))
            if decision is not None and decision.close:
                break
            if not emitted:
                _idle(workers, clock, deadline)
        newly = decision.done_inputs - done_inputs
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
        last = done_inputs == all_inputs
        for worker in workers:
            worker.snapshot_epoch(epoch)
        for worker in workers:
            worker.close_epoch(epoch, last)
        logger.debug("flow %r: closed epoch %d", plan.flow_id, epoch)
        if last:
            return epoch
        epoch += 1


def _idle(workers: List[Worker], clock: Clock, deadline: float) -> None:
    """Sleep until a partition or timer wants to run, or the epoch ends."""
    wait = deadline - clock.monotonic()
    wakes = [t for t in (w.next_wake() for w in workers) if t is not None]
    if wakes:
        until = (min(wakes) - clock.now()).total_seconds()
        wait = min(wait, until)
    clock.sleep(max(wait, _IDLE_POLL_SECONDS))
