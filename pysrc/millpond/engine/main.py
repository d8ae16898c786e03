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

from datetime import timedelta
from typing import TYPE_CHECKING, Optional, Sequence

from millpond.dataflow import Dataflow
from millpond.engine.driver import execute

if TYPE_CHECKING:  # pragma: no cover
    from millpond.recovery import RecoveryConfig

__all__ = ["run_main", "cluster_main"]


def run_main(
    flow: Dataflow,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional["RecoveryConfig"] = None,
) -> None:
    """Run ``flow`` on one worker in the calling thread until its input ends.

    ``epoch_interval`` defaults to 10 seconds; ``recovery_config`` (a
    ``millpond.recovery.RecoveryConfig``) turns recovery on. Exceptions from
    user code arrive as ``millpond.errors.DataflowError``; ``ValueError``
    for a flow without input or output.
    """
    execute(flow, worker_count=1, epoch_interval=epoch_interval, recovery_config=recovery_config)


def cluster_main(
    flow: Dataflow,
    addresses: Optional[Sequence[str]],
    proc_id: int,
    *,
    epoch_interval: Optional[timedelta] = None,
    recovery_config: Optional["RecoveryConfig"] = None,
    worker_count_per_proc: int = 1,
) -> None:
    """Run ``flow`` with ``worker_count_per_proc`` workers in this process.

    The workers take turns in the calling thread (one core), each owning
    its share of the keys. ``addresses=[]`` (or a single address with
    ``proc_id=0``) means a one-process cluster; several processes are not
    supported yet (``ValueError``). Keyed items go to the worker that owns
    their key, so results are the same for any worker count.
    """
    addrs = list(addresses or [])
    if len(addrs) > 1:
        raise ValueError(
            f"multi-process clusters are not supported yet ({len(addrs)} addresses given); "
            "run one process with more workers instead (-w N on the command line, worker_count_per_proc=N here)"
        )
    if proc_id != 0:
        raise ValueError(f"proc_id must be 0 for a one-process cluster; got {proc_id!r}")
    if not isinstance(worker_count_per_proc, int) or worker_count_per_proc < 1:
        raise ValueError(
            f"worker_count_per_proc must be a positive int; got {worker_count_per_proc!r}"
        )
    execute(
        flow,
        worker_count=worker_count_per_proc,
        epoch_interval=epoch_interval,
        recovery_config=recovery_config,
    )
