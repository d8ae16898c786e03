"""Count the words of a text file and write ``word<TAB>count`` lines.

Run it, with recovery on, from the repository root::

    python -m millpond.run 'examples/wordcount.py:get_flow("in.txt", "counts.tsv")' -d state

Kill it at any point and run the same command again: it resumes from the
last committed epoch, and ``counts.tsv`` ends up exactly as after a run that
never failed (the file source resumes at its byte offset and the file sink
truncates to its own). The counts are final counts (``count_final``): they
are emitted when the input ends and the state is then dropped, so appending
to ``in.txt`` and running again counts only the appended lines.
"""

from __future__ import annotations

import re
from typing import List, Tuple

import millpond.operators as op
from millpond.connectors.files import FileSink, FileSource
from millpond.dataflow import Dataflow

__all__ = ["get_flow", "words"]

_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")


def words(line: str) -> List[str]:
    """Lower-cased words of ``line``: runs of letters and digits, with inner
    apostrophes (``cat's``, ``w42``, ``2024``); punctuation and ``_`` split words."""
    return _WORD.findall(line.lower())


def _format(word_count: Tuple[str, int]) -> Tuple[str, str]:
    word, count = word_count
    return word, f"{word}\t{count}"


def get_flow(in_path: str, out_path: str) -> Dataflow:
    """The word count of ``in_path``, written to ``out_path`` at the end of the input."""
    flow = Dataflow("wordcount")
    lines = op.input("read", flow, FileSource(in_path))
    tokens = op.flat_map("split", lines, words)
    counts = op.count_final("count", tokens, lambda word: word)
    op.output("write", op.map("format", counts, _format), FileSink(out_path))
    return flow
