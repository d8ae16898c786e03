"""What a window holds: :class:`WindowLogic` (one per window per key), the
:class:`WindowMetadata` emitted when a window closes, and the three streams
of a windowing operator, :class:`WindowOut`."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, Iterable, Set, Tuple, TypeVar

from millpond.dataflow import Stream

__all__ = ["WindowLogic", "WindowMetadata", "WindowOut"]

V = TypeVar("V")
W = TypeVar("W")
S = TypeVar("S")


@dataclass
class WindowMetadata:
    """A window's extent: ``[open_time, close_time)``, and for a session the
    ids of the sessions merged into it."""

    open_time: datetime
    close_time: datetime
    merged_ids: Set[int] = field(default_factory=set)


class WindowLogic(ABC, Generic[V, W, S]):
    """The logic of one window of one key (built by ``window``'s builder
    with ``None`` for a new window, or its last snapshot when restored).

    Each method returns an iterable of values the operator emits downstream
    as ``(key, (window_id, value))``.
    """

    @abstractmethod
    def on_value(self, value: V) -> Iterable[W]:
        """A value falls in this window."""

    @abstractmethod
    def on_merge(self, original: "WindowLogic[V, W, S]") -> Iterable[W]:
        """Session ``original`` is merged into this one (and then dropped)."""

    @abstractmethod
    def on_close(self) -> Iterable[W]:
        """The window closes (the watermark passed its close time, or EOF)."""

    @abstractmethod
    def snapshot(self) -> S:
        """This window's state: picklable, not mutated afterwards."""


@dataclass(frozen=True)
class WindowOut(Generic[V, W]):
    """The streams of a windowing operator, keyed, with values
    ``(window_id, x)``: ``down`` the window logic's outputs, ``late`` the
    items that arrived after their windows closed, ``meta`` a
    :class:`WindowMetadata` per window as it closes."""

    down: "Stream[Tuple[str, Tuple[int, W]]]"
    late: "Stream[Tuple[str, Tuple[int, V]]]"
    meta: "Stream[Tuple[str, Tuple[int, WindowMetadata]]]"


