"""A custom polling source: sample the system load every interval and print it.

::

    python -m millpond.run 'examples/polling.py:get_flow(samples=5, interval=0.5)'

``LoadAverage`` shows the shape of a ``SimplePollingSource``: return an item
from ``next_item``, ``None`` for "nothing this time", and raise
``StopIteration`` to end the input.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import millpond.operators as op
from millpond.connectors.stdio import StdOutSink
from millpond.dataflow import Dataflow
from millpond.inputs import SimplePollingSource

__all__ = ["LoadAverage", "get_flow"]


class LoadAverage(SimplePollingSource[str]):
    """Emits ``"<UTC time> load=<1-minute load average>"``, ``samples`` times."""

    def __init__(self, interval: timedelta, samples: int) -> None:
        super().__init__(interval)
        self._left = samples

    def next_item(self) -> str:
        if self._left <= 0:
            raise StopIteration()
        self._left -= 1
        load1, _load5, _load15 = os.getloadavg()
        return f"{datetime.now(timezone.utc):%H:%M:%S} load={load1:.2f}"


def get_flow(samples: int = 10, interval: float = 1.0) -> Dataflow:
    """Print ``samples`` load readings, one every ``interval`` seconds."""
    flow = Dataflow("polling")
    readings = op.input("load", flow, LoadAverage(timedelta(seconds=interval), samples))
    op.output("print", readings, StdOutSink())
    return flow
