"""Inputs that abort a run part-way: ``TestingSource.ABORT()`` markers
placed among the items, for tests that resume and compare with a run that
never failed."""

from __future__ import annotations

from typing import Any, List, Sequence

from millpond.testing import TestingSource


def with_aborts(items: Sequence[Any], at: Sequence[int]) -> List[Any]:
    """``items`` with one ABORT marker before index ``i`` for each time
    ``i`` appears in ``at`` (each marker fires once: the run it stops
    resumes after it)."""
    out: List[Any] = []
    for i, x in enumerate(items):
        out.extend(TestingSource.ABORT() for _ in range(at.count(i)))
        out.append(x)
    return out
