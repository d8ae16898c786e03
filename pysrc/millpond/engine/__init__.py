"""The millpond runtime: compiles a Dataflow and executes it on workers.

Modules, one concept each: ``plan`` (the compiled graph), ``worker`` (one
worker's step runtimes), ``steps``/``io_steps``/``stateful_step`` (the
runtimes of core steps), ``exchange`` (worker-to-worker routing),
``progress`` (agreement on closing epochs), ``clock`` (time), ``hooks`` (the
recovery calls) and ``driver`` (the epoch loop). Users run flows through
:mod:`millpond.testing` or ``python -m millpond.run``.
"""

from millpond.engine.driver import DEFAULT_EPOCH_INTERVAL, execute

__all__ = ["execute", "DEFAULT_EPOCH_INTERVAL"]
