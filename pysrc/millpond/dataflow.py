"""Dataflows, streams and the ``operator`` decorator.

A :class:`Dataflow` is a graph of named steps. Each operator call adds a
step and returns the :class:`Stream` (or streams) it produces::

    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.testing import TestingSink, TestingSource

    flow = Dataflow("double")
    nums = op.input("inp", flow, TestingSource([1, 2, 3]))
    doubled = op.map("double", nums, lambda x: x * 2)
    op.output("out", doubled, TestingSink(out := []))

Step ids are strings without ``.``; a step created inside a composite
operator is named ``parent.child``, so full ids look like
``double.double.flat_map_batch``. A duplicate id within one scope is a
``ValueError`` when the flow is built. Full step ids also name the step's
recovery state, so renaming a stateful step orphans its state.

Composite operators are ordinary functions decorated with :func:`operator`;
they call other operators, and the steps they create are nested under their
own id::

    @operator
    def add_one(step_id: str, up: Stream[int]) -> Stream[int]:
        return op.map("add", up, lambda x: x + 1)
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Generic, List, Optional, Tuple, TypeVar

__all__ = ["Dataflow", "Stream", "operator"]

X = TypeVar("X")
F = TypeVar("F", bound=Callable[..., Any])


def _check_id(what: str, value: object) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str; got {type(value).__name__}: {value!r}")
    if value == "":
        raise ValueError(f"{what} must not be empty")
    if "." in value:
        raise ValueError(
            f"{what} {value!r} must not contain '.'; "
            "dots separate the parts of nested step ids"
        )
    return value


@dataclass
class _CoreStep:
    """One step the runtime executes directly (see ``millpond.engine.plan``).

    ``ups`` are the ids of the streams read, one per input port, in order;
    ``downs`` are the names of the output ports (the produced stream ids are
    ``f"{step_id}.{port}"``).
    """

    step_id: str
    kind: str
    ups: List[str]
    downs: List[str]
    params: Dict[str, Any] = field(default_factory=dict)


class _Graph:
    """The mutable state shared by a flow and its scoped views."""

    def __init__(self, flow_id: str) -> None:
        self.flow_id = flow_id
        self.steps: List[_CoreStep] = []
        # Child ids already used in each scope (keyed by the scope's full id).
        self.child_ids: Dict[str, set[str]] = {}
        self.streams: set[str] = set()

    def claim(self, scope_id: str, step_id: str) -> str:
        used = self.child_ids.setdefault(scope_id, set())
        if step_id in used:
            raise ValueError(
                f"step id {step_id!r} is used twice in {scope_id!r}; "
                "step ids must be unique within their scope"
            )
        used.add(step_id)
        return f"{scope_id}.{step_id}"


class Dataflow:
    """A dataflow: the graph of steps that ``run_main`` or the CLI executes.

    ``flow_id`` names the flow and namespaces its recovery data; it must be a
    non-empty string without ``.`` (``ValueError`` otherwise).
    """

    flow_id: str

    def __init__(self, flow_id: str) -> None:
        _check_id("flow_id", flow_id)
        self.flow_id = flow_id
        self._graph = _Graph(flow_id)
        self._scope_id = flow_id

    @classmethod
    def _view(cls, graph: _Graph, scope_id: str) -> "Dataflow":
        # A view of the same graph whose new steps are nested under scope_id;
        # composite operators receive these so their inner steps nest.
        view = cls.__new__(cls)
        view.flow_id = graph.flow_id
        view._graph = graph
        view._scope_id = scope_id
        return view

    def _add_step(
        self,
        step_id: str,
        kind: str,
        ups: List["Stream[Any]"],
        downs: List[str],
        params: Dict[str, Any],
    ) -> List["Stream[Any]"]:
        for up in ups:
            if up._graph is not self._graph:
                raise ValueError(
                    f"step {step_id!r} reads stream {up.stream_id!r} of another "
                    "Dataflow; streams cannot cross flows"
                )
        self._graph.steps.append(
            _CoreStep(step_id, kind, [u.stream_id for u in ups], list(downs), params)
        )
        outs: List[Stream[Any]] = []
        for port in downs:
            sid = f"{step_id}.{port}"
            self._graph.streams.add(sid)
            outs.append(Stream(sid, self._graph, step_id))
        return outs

    def __repr__(self) -> str:
        return f"Dataflow({self.flow_id!r})"


class Stream(Generic[X]):
    """A handle on the items a step produces; pass it to the next operator.

    A stream may feed several steps: each of them gets every item. Keyed
    streams carry ``(key: str, value)`` 2-tuples.
    """

    def __init__(self, stream_id: str, graph: _Graph, scope_id: str) -> None:
        self.stream_id = stream_id
        self._graph = graph
        self._scope_id = scope_id

    @property
    def flow(self) -> Dataflow:
        """The (scoped) flow this stream belongs to."""
        return Dataflow._view(self._graph, self._scope_id)

    def _rescope(self, scope_id: str) -> "Stream[X]":
        return Stream(self.stream_id, self._graph, scope_id)

    def then(self, op_fn: Callable[..., Any], step_id: str, *args: Any, **kwargs: Any) -> Any:
        """Chain an operator: ``s.then(op.map, "m", f)`` is ``op.map("m", s, f)``."""
        return op_fn(step_id, self, *args, **kwargs)

    def __repr__(self) -> str:
        return f"Stream({self.stream_id!r})"


def _is_kind(annotation: Any, name: str) -> bool:
    # Annotations are strings under ``from __future__ import annotations``;
    # ``KeyedStream`` (an alias used for keyed streams) counts as a Stream.
    if isinstance(annotation, str):
        head = annotation.split("[", 1)[0].strip().rsplit(".", 1)[-1]
        return head == name or (name == "Stream" and head == "KeyedStream")
    origin = getattr(annotation, "__origin__", annotation)
    return getattr(origin, "__name__", None) == name


def _rescope_result(result: Any, scope_id: str) -> Any:
    if isinstance(result, Stream):
        return result._rescope(scope_id)
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        changes = {
            f.name: _rescope_result(getattr(result, f.name), scope_id)
            for f in dataclasses.fields(result)
        }
        return dataclasses.replace(result, **changes)
    if isinstance(result, tuple) and not hasattr(result, "_fields"):
        return tuple(_rescope_result(r, scope_id) for r in result)
    if isinstance(result, list):
        return [_rescope_result(r, scope_id) for r in result]
    if isinstance(result, dict):
        return {k: _rescope_result(v, scope_id) for k, v in result.items()}
    return result


def operator(fn: F) -> F:
    """Turn a function ``fn(step_id, ...)`` into an operator with its own scope.

    The decorated function must take the step id first. Parameters annotated
    ``Stream[...]`` (including ``*ups: Stream[...]``) must receive streams and
    parameters annotated ``Dataflow`` must receive a flow (``TypeError``
    otherwise); all of them must belong to one flow. Operators called inside
    the function create steps named ``<scope>.<step_id>.<child>``. The same
    step id twice in one scope is a ``ValueError``.
    """
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params:
        raise TypeError(f"operator {fn.__name__!r} must take a step_id first")
    stream_params = [p.name for p in params[1:] if _is_kind(p.annotation, "Stream")]
    flow_params = [p.name for p in params[1:] if _is_kind(p.annotation, "Dataflow")]
    op_name = fn.__name__

    @functools.wraps(fn)
    def wrapper(step_id: str, *args: Any, **kwargs: Any) -> Any:
        try:
            bound = sig.bind(step_id, *args, **kwargs)
        except TypeError as ex:
            raise TypeError(f"op.{op_name}: {ex}") from None
        _check_id(f"step_id of op.{op_name}", step_id)
        graph: Optional[_Graph] = None
        scope_id: Optional[str] = None
        arguments = bound.arguments

        def check(name: str, value: Any, kind: Any) -> None:
            nonlocal graph, scope_id
            if not isinstance(value, kind):
                raise TypeError(
                    f"op.{op_name} step {step_id!r}: argument {name!r} must be a "
                    f"{kind.__name__}; got {type(value).__name__}: {value!r:.80}"
                )
            if graph is None:
                graph, scope_id = value._graph, value._scope_id
            elif value._graph is not graph:
                raise ValueError(
                    f"op.{op_name} step {step_id!r}: argument {name!r} belongs to "
                    "another Dataflow; all inputs of a step must share one flow"
                )

        for name in flow_params:
            if name in arguments:
                check(name, arguments[name], Dataflow)
        for name in stream_params:
            if name not in arguments:
                continue
            value = arguments[name]
            if sig.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
                for i, v in enumerate(value):
                    check(f"{name}[{i}]", v, Stream)
            else:
                check(name, value, Stream)
        if graph is None or scope_id is None:
            raise TypeError(
                f"op.{op_name} step {step_id!r}: needs at least one Stream or "
                "Dataflow argument to know which flow to add the step to"
            )
        full_id = graph.claim(scope_id, step_id)
        # Hand the function views scoped to this step, so the steps it
        # creates nest under full_id.
        for name in flow_params:
            if name in arguments:
                arguments[name] = Dataflow._view(graph, full_id)
        for name in stream_params:
            if name not in arguments:
                continue
            value = arguments[name]
            if sig.parameters[name].kind is inspect.Parameter.VAR_POSITIONAL:
                arguments[name] = tuple(v._rescope(full_id) for v in value)
            else:
                arguments[name] = value._rescope(full_id)
        result = fn(*bound.args, **bound.kwargs)
        return _rescope_result(result, scope_id)

    return wrapper  # type: ignore[return-value]


def _step_scope(obj: Any) -> Tuple[Dataflow, str]:
    """Inside a core operator: the flow view and the full id of the step.

    Core operators receive streams/flows rescoped by :func:`operator`, so the
    scope of any of them is the operator's own full step id.
    """
    if isinstance(obj, Stream):
        return obj.flow, obj._scope_id
    if isinstance(obj, Dataflow):
        return obj, obj._scope_id
    raise TypeError(f"expected a Stream or Dataflow; got {type(obj).__name__}")
