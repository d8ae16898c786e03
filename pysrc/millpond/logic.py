"""The per-key logic of stateful operators: what a user subclasses, and
how the engine asks a logic object about itself.

:class:`StatefulBatchLogic` is the logic of ``op.stateful_batch`` (one
object per key, called with the values of an activation);
:class:`StatefulLogic` is the per-item form of ``op.stateful``, run through
:class:`StatefulShim`. Both are re-exported by :mod:`millpond.operators`,
where Bytewax users look for them.

>>> class Count(StatefulBatchLogic):
...     def __init__(self, n):
...         self.n = n or 0
...     def on_batch(self, values):
...         self.n += len(values)
...         return [self.n], StatefulBatchLogic.RETAIN
...     def snapshot(self):
...         return self.n
>>> Count(None).on_batch(["a", "b"])
([2], False)
>>> sets_timers(Count), keeps_default_eof(Count)
(False, True)
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import datetime
from typing import Any, Callable, Generic, Iterable, List, Optional, Tuple, TypeVar

__all__ = [
    "StatefulBatchLogic",
    "StatefulLogic",
    "StatefulShim",
    "logic_class",
    "sets_timers",
    "keeps_default_eof",
]

V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")


class StatefulBatchLogic(ABC, Generic[V, W, S]):
    """Per-key logic of :func:`stateful_batch`.

    One object exists per key; ``builder(resume_state)`` creates it with
    ``None`` for a new key or the last :meth:`snapshot` when the key is
    restored. Each method returns ``(outputs, discard)``: an iterable of
    values to emit (the engine pairs each with the key) and whether to drop
    the key (``DISCARD``) or keep it (``RETAIN``).
    """

    #: Keep this key's logic after the call.
    RETAIN: bool = False
    #: Drop this key's logic; its next snapshot records a deletion.
    DISCARD: bool = True

    @abstractmethod
    def on_batch(self, values: List[V]) -> Tuple[Iterable[W], bool]:
        """Values that arrived for this key in one activation, in order."""

    def on_notify(self) -> Tuple[Iterable[W], bool]:
        """The time from :meth:`notify_at` has come. Default: nothing."""
        return ((), StatefulBatchLogic.RETAIN)

    def on_eof(self) -> Tuple[Iterable[W], bool]:
        """The upstream ended. Default: nothing, keep the state."""
        return ((), StatefulBatchLogic.RETAIN)

    def notify_at(self) -> Optional[datetime]:
        """When to call :meth:`on_notify` (a UTC-aware datetime), or None.

        Asked again after every activation of this key.
        """
        return None

    @abstractmethod
    def snapshot(self) -> S:
        """This key's state: picklable, and not mutated afterwards. Called
        for the epoch's snapshot, and in batch mode possibly also right after
        each activation of the key, so it must not change the key's state."""


class StatefulLogic(ABC, Generic[V, W, S]):
    """Per-key logic of :func:`stateful`, called once per value.

    Like :class:`StatefulBatchLogic` but with :meth:`on_item` instead of
    ``on_batch``.
    """

    RETAIN: bool = False
    DISCARD: bool = True

    @abstractmethod
    def on_item(self, value: V) -> Tuple[Iterable[W], bool]:
        """One value for this key."""

    def on_notify(self) -> Tuple[Iterable[W], bool]:
        """The time from :meth:`notify_at` has come. Default: nothing."""
        return ((), StatefulLogic.RETAIN)

    def on_eof(self) -> Tuple[Iterable[W], bool]:
        """The upstream ended. Default: nothing, keep the state."""
        return ((), StatefulLogic.RETAIN)

    def notify_at(self) -> Optional[datetime]:
        """When to call :meth:`on_notify` (a UTC-aware datetime), or None."""
        return None

    @abstractmethod
    def snapshot(self) -> S:
        """This key's state: picklable, and not mutated afterwards. Called
        for the epoch's snapshot, and in batch mode possibly also right after
        each activation of the key, so it must not change the key's state."""




class StatefulShim(StatefulBatchLogic[V, W, S]):
    """Runs a per-item :class:`StatefulLogic` as a batch logic."""

    __slots__ = ("builder", "logic")

    def __init__(self, builder: Callable[[Optional[S]], StatefulLogic[V, W, S]], logic: StatefulLogic[V, W, S]):
        self.builder = builder
        self.logic = logic

    def on_batch(self, values: List[V]) -> Tuple[Iterable[W], bool]:
        out: List[W] = []
        discard = False
        for v in values:
            if discard:
                # The key was dropped mid-batch; the rest starts afresh.
                self.logic = self.builder(None)
            emit, discard = self.logic.on_item(v)
            out.extend(emit)
        return out, discard

    def on_notify(self) -> Tuple[Iterable[W], bool]:
        return self.logic.on_notify()

    def on_eof(self) -> Tuple[Iterable[W], bool]:
        return self.logic.on_eof()

    def notify_at(self) -> Optional[datetime]:
        return self.logic.notify_at()

    def snapshot(self) -> S:
        return self.logic.snapshot()


def logic_class(logic: Any) -> type:
    """The user's class behind a logic object (the per-item logic for a
    :class:`StatefulShim`)."""
    return type(logic.logic) if type(logic) is StatefulShim else type(logic)


def sets_timers(cls: type) -> bool:
    """Whether logic class ``cls`` overrides ``notify_at``: one that does
    not (or a duck-typed class without it) never sets a timer, so a resumed
    run need not build every key just to ask it."""
    return getattr(cls, "notify_at", None) not in (None, *_DEFAULT_NOTIFY_AT)


def keeps_default_eof(cls: type) -> bool:
    """Whether logic class ``cls`` keeps the default ``on_eof`` (or, duck
    typed, has none), which emits nothing and keeps the state: calling it
    would only mark the key touched and snapshot it again, unchanged."""
    return getattr(cls, "on_eof", None) in (None, *_DEFAULT_ON_EOF)


_DEFAULT_NOTIFY_AT = (StatefulBatchLogic.notify_at, StatefulLogic.notify_at)
_DEFAULT_ON_EOF = (StatefulBatchLogic.on_eof, StatefulLogic.on_eof)
