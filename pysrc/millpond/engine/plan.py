"""Compile a :class:`~millpond.dataflow.Dataflow` into an execution plan.

The plan is the flow's core steps in topological order (the order they were
declared in, since a step can only read streams that already exist), with
the consumers of every output port resolved to ``(step index, input port)``
and, for each step, the input steps it transitively reads from, which is
what decides when the step's upstream has reached EOF.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, List, Mapping, Tuple

from millpond.dataflow import Dataflow

__all__ = ["PlanStep", "Plan", "compile_plan", "CORE_KINDS"]

#: The step kinds the runtime executes; everything else is built from them.
CORE_KINDS = frozenset(
    {
        "input",
        "output",
        "flat_map_batch",
        "branch",
        "merge",
        "redistribute",
        "inspect_debug",
        "stateful_batch",
    }
)


@dataclass(frozen=True)
class PlanStep:
    """One core step of the plan."""

    index: int
    step_id: str
    kind: str
    params: Mapping[str, Any]
    #: For each output port (in declaration order): the consumers of that
    #: port as ``(step index, input port)``.
    downs: Tuple[Tuple[Tuple[int, int], ...], ...]
    #: Indexes of the input steps this step (transitively) reads from.
    input_ancestors: FrozenSet[int]


@dataclass(frozen=True)
class Plan:
    """A compiled flow: steps in topological order."""

    flow_id: str
    steps: Tuple[PlanStep, ...]

    @property
    def input_indexes(self) -> Tuple[int, ...]:
        return tuple(s.index for s in self.steps if s.kind == "input")


def compile_plan(flow: Dataflow) -> Plan:
    """Check and compile ``flow``.

    Raises ``TypeError`` for something that is not a ``Dataflow`` and
    ``ValueError`` for a flow without an input step, or without any step
    that ends a path: an output or an inspect step (``op.inspect``,
    ``op.inspect_debug``, ``op.raises``) is enough, as with Bytewax.
    """
    if not isinstance(flow, Dataflow):
        raise TypeError(f"expected a Dataflow to run; got {type(flow).__name__}: {flow!r:.80}")
    core = flow._graph.steps
    kinds = [s.kind for s in core]
    if "input" not in kinds:
        raise ValueError(
            f"Dataflow {flow.flow_id!r} has no input step; add one with op.input(...)"
        )
    if "output" not in kinds and "inspect_debug" not in kinds:
        raise ValueError(
            f"Dataflow {flow.flow_id!r} has no output or inspect step; add one with "
            "op.output(...) (or op.inspect(...) to only look at the items)"
        )
    producer: Dict[str, Tuple[int, int]] = {}
    for i, s in enumerate(core):
        if s.kind not in CORE_KINDS:
            raise ValueError(f"step {s.step_id!r} has unknown kind {s.kind!r}")
        for p, port in enumerate(s.downs):
            producer[f"{s.step_id}.{port}"] = (i, p)
    consumers: List[List[List[Tuple[int, int]]]] = [[[] for _ in s.downs] for s in core]
    ancestors: List[FrozenSet[int]] = []
    for i, s in enumerate(core):
        anc = {i} if s.kind == "input" else set()
        for in_port, sid in enumerate(s.ups):
            src, src_port = producer[sid]
            if src >= i:  # pragma: no cover - impossible through the public API
                raise ValueError(f"step {s.step_id!r} reads a stream declared after it")
            consumers[src][src_port].append((i, in_port))
            anc |= ancestors[src]
        ancestors.append(frozenset(anc))
    steps = tuple(
        PlanStep(
            index=i,
            step_id=s.step_id,
            kind=s.kind,
            params=dict(s.params),
            downs=tuple(tuple(c) for c in consumers[i]),
            input_ancestors=ancestors[i],
        )
        for i, s in enumerate(core)
    )
    return Plan(flow.flow_id, steps)
