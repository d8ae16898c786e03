"""Running totals per customer from a CSV of orders, spread over several files.

The input has a header ``customer,amount``; every order emits the
customer's new running total. Output goes to ``out_dir/totals_0.txt`` ...,
one file per partition, each customer always in the same file, in order.
``examples/data/orders.csv`` is a sample; from the repository root::

    python -m millpond.run 'examples/csv_totals.py:get_flow("examples/data/orders.csv", "totals")' -w 2 -d state

writes ``totals/totals_0.txt`` and ``totals/totals_1.txt``; ann's three
orders (12.50, 7.25, 30.00) give the lines ``ann,12.50``, ``ann,19.75`` and
``ann,49.75`` in one of them.

With ``-d`` a resumed run restores each customer's total, re-reads the CSV
from the byte after the last committed row and truncates the output files to
what was committed, so the files never show an order twice. Running the
command again after it finished reads only rows appended to the CSV since.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import millpond.operators as op
from millpond.connectors.files import CSVSource, DirSink
from millpond.dataflow import Dataflow

__all__ = ["get_flow"]


def _amount(row: Dict[str, str]) -> float:
    return float(row["amount"])


def _add(total: Optional[float], amount: float) -> Tuple[float, float]:
    new_total = (total or 0.0) + amount
    return new_total, new_total


def _format(customer_total: Tuple[str, float]) -> Tuple[str, str]:
    customer, total = customer_total
    return customer, f"{customer},{total:.2f}"


def get_flow(csv_path: str, out_dir: str, file_count: int = 2) -> Dataflow:
    """Running totals of ``amount`` per ``customer`` in ``csv_path``."""
    flow = Dataflow("csv_totals")
    rows = op.input("orders", flow, CSVSource(csv_path))
    by_customer = op.key_on("by_customer", rows, lambda row: row["customer"])
    amounts = op.map_value("amount", by_customer, _amount)
    totals = op.stateful_map("running_total", amounts, _add)
    op.output(
        "write",
        op.map("format", totals, _format),
        DirSink(out_dir, file_count, file_namer=lambda i, _n: f"totals_{i}.txt"),
    )
    return flow
