"""The millpond runtime: compiles a Dataflow and executes it on workers.

Modules, one concept each: ``main`` (:func:`run_main`, :func:`cluster_main`,
the entry points), ``driver`` (:func:`execute` and the epoch loop),
``plan`` (the compiled graph), ``worker`` (one worker's step runtimes),
``steps``/``io_steps``/``stateful_step`` (the runtimes of core steps),
``exchange`` (worker-to-worker routing), ``progress`` (agreement on closing
epochs), ``clock`` (time), ``pygc`` (Python's garbage-collection
thresholds while a flow runs), ``hooks`` (the recovery calls the engine makes)
and ``recovery_run`` (those calls when recovery is on: restore, snapshot,
commit through the Go core). ``python -m millpond.run`` and
:mod:`millpond.testing` both run flows through here.
"""

from millpond.engine.driver import DEFAULT_EPOCH_INTERVAL, execute
from millpond.engine.main import cluster_main, run_main

__all__ = ["execute", "run_main", "cluster_main", "DEFAULT_EPOCH_INTERVAL"]
