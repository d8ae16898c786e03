"""Ready-made sources and sinks.

* :mod:`millpond.connectors.files`: ``FileSource``, ``DirSource``,
  ``CSVSource``, ``FileSink``, ``DirSink`` (resumable; a file-to-file flow is
  exactly-once).
* :mod:`millpond.connectors.stdio`: ``StdOutSink`` and ``StdInSource``.
"""

__all__: list[str] = []
