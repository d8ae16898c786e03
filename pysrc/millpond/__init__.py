"""millpond: Python stream processing with a Go recovery core.

Write a dataflow with :mod:`millpond.dataflow` and :mod:`millpond.operators`,
run it with ``python -m millpond.run``, and turn recovery on with a local
state directory (``-d``) and a durable backup (``-b``).
"""

__version__ = "0.1.0"
