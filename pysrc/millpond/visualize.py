"""Draw a dataflow's step graph, for docs and debugging.

* :func:`to_json`: the steps, nested by scope, with the streams between them.
* :func:`to_mermaid`: a Mermaid ``flowchart`` (paste it into Markdown).
* :func:`to_plantuml`: a PlantUML component diagram.

Top-level steps (the ones your flow code names) are drawn by default; with
``recursive=True`` the steps inside composite operators are drawn inside
their parents, down to the core steps the runtime executes. From a shell::

    python -m millpond.visualize flows/wc.py            # Mermaid
    python -m millpond.visualize flows/wc.py:flow --format plantuml -r

``IMPORT_STR`` is the one ``python -m millpond.run`` takes.

What is recorded: millpond keeps the core steps (``input``, ``output``,
``flat_map_batch``, ``branch``, ``merge``, ``redistribute``,
``inspect_debug``, ``stateful_batch``) with their full ids; a composite
operator (``op.map``, ``op.count_final``, your own ``@operator``) is the
scope its inner steps are nested in. So a core step is labelled with its
kind (``inp (input)``) and a composite with its step name only.

>>> import millpond.operators as op
>>> from millpond.dataflow import Dataflow
>>> from millpond.testing import TestingSink, TestingSource
>>> flow = Dataflow("demo")
>>> nums = op.input("inp", flow, TestingSource([1, 2, 3]))
>>> op.output("out", op.map("double", nums, lambda x: 2 * x), TestingSink([]))
>>> print(to_mermaid(flow))
flowchart TD
subgraph demo["demo (Dataflow)"]
demo.inp["inp (input)"]
demo.double["double"]
demo.out["out (output)"]
demo.inp --> demo.double
demo.double --> demo.out
end
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Tuple

from millpond.dataflow import Dataflow, _CoreStep

__all__ = ["to_json", "to_mermaid", "to_plantuml", "main"]


@dataclass
class _Node:
    """A step: a core step (``core`` set) or a composite scope."""

    step_id: str  # full id
    name: str  # the last part of the id
    core: Optional[_CoreStep] = None
    children: List["_Node"] = field(default_factory=list)
    # Stream ids read from outside the node / produced inside and used
    # outside it (or by nobody), in order of first appearance.
    inputs: List[str] = field(default_factory=list)
    outputs: List[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.core.kind if self.core is not None else "composite"

    def leaves(self) -> List[_CoreStep]:
        if self.core is not None:
            return [self.core]
        return [c for child in self.children for c in child.leaves()]


def _graph_of(flow: Any) -> Any:
    if not isinstance(flow, Dataflow):
        raise TypeError(f"expected a millpond.dataflow.Dataflow; got {type(flow).__name__}: {flow!r:.80}")
    return flow._graph


def _tree(flow: Dataflow) -> Tuple[_Node, Dict[str, str]]:
    """The flow as a tree of scopes and, for each stream, the id of the core
    step that produces it."""
    graph = _graph_of(flow)
    root = _Node(graph.flow_id, graph.flow_id)
    nodes: Dict[str, _Node] = {graph.flow_id: root}
    producer: Dict[str, str] = {}
    for step in graph.steps:
        parts = step.step_id.split(".")
        parent = root
        for i in range(2, len(parts) + 1):
            sid = ".".join(parts[:i])
            node = nodes.get(sid)
            if node is None:
                node = _Node(sid, parts[i - 1])
                nodes[sid] = node
                parent.children.append(node)
            parent = node
        parent.core = step
        for port in step.downs:
            producer[f"{step.step_id}.{port}"] = step.step_id
    readers: Dict[str, List[str]] = {}
    for step in graph.steps:
        for up in step.ups:
            readers.setdefault(up, []).append(step.step_id)

    def inside(step_id: str, node: _Node) -> bool:
        return step_id == node.step_id or step_id.startswith(node.step_id + ".")

    def fill(node: _Node) -> None:
        for child in node.children:
            fill(child)
        for leaf in node.leaves():
            for up in leaf.ups:
                if not inside(producer.get(up, ""), node) and up not in node.inputs:
                    node.inputs.append(up)
            for port in leaf.downs:
                sid = f"{leaf.step_id}.{port}"
                users = readers.get(sid, [])
                if (not users or any(not inside(u, node) for u in users)) and sid not in node.outputs:
                    node.outputs.append(sid)

    for child in root.children:
        fill(child)
    return root, producer


def _port(stream_id: str) -> str:
    return stream_id.rsplit(".", 1)[1]


def _owner(stream_id: str) -> str:
    return stream_id.rsplit(".", 1)[0]


def _json_node(node: _Node) -> Dict[str, Any]:
    out: Dict[str, Any] = {
        "step_id": node.step_id,
        "step_name": node.name,
        "kind": node.kind,
        "inputs": list(node.inputs),
        "outputs": list(node.outputs),
    }
    if node.core is not None:
        # The core step's own ports: streams read, in port order, and the
        # names of the ports it writes (stream id = step_id + "." + port).
        out["inputs"] = list(node.core.ups)
        out["outputs"] = [f"{node.step_id}.{p}" for p in node.core.downs]
    out["substeps"] = [_json_node(c) for c in node.children]
    return out


def to_json(flow: Dataflow) -> str:
    """The step graph as indented JSON.

    ``{"flow_id", "substeps": [step, ...]}``; each step has ``step_id``
    (full id), ``step_name``, ``kind`` (the core kind, or ``"composite"``),
    ``inputs`` (ids of the streams it reads from outside itself),
    ``outputs`` (ids of the streams it produces that are read outside it,
    or by no step) and its own ``substeps``. A stream id is
    ``<id of the core step that writes it>.<port>`` (``down``, or ``trues``
    / ``falses`` for a branch), so following ``inputs`` to the step whose
    ``outputs`` hold the same id walks the graph.
    """
    root, _ = _tree(flow)
    doc = {"flow_id": root.step_id, "substeps": [_json_node(c) for c in root.children]}
    return json.dumps(doc, indent=2)


def _label(node: _Node) -> str:
    if node.core is None or node.name == node.kind:
        return node.name
    return f"{node.name} ({node.kind})"


def _edges(root: _Node, producer: Dict[str, str], recursive: bool) -> List[Tuple[str, str, str]]:
    """``(from_step, to_step, port)`` between the drawn steps: the top-level
    steps, or with ``recursive`` the core steps."""
    graph_steps: List[_CoreStep] = root.leaves()

    def drawn(step_id: str) -> str:
        if recursive:
            return step_id
        parts = step_id.split(".")
        return ".".join(parts[:2])

    edges: List[Tuple[str, str, str]] = []
    for step in graph_steps:
        for up in step.ups:
            src = producer.get(up)
            if src is None:
                continue
            a, b = drawn(src), drawn(step.step_id)
            port = _port(up)
            edge = (a, b, "" if port == "down" else port)
            if a != b and edge not in edges:
                edges.append(edge)
    return edges


def _safe_id(step_id: str, keep: str) -> str:
    """``step_id`` with every character outside ``[A-Za-z0-9_]`` and
    ``keep`` written as ``_<hex>_`` (step ids may hold spaces, quotes...)."""
    return "".join(
        c if (c.isascii() and (c.isalnum() or c == "_")) or c in keep else f"_{ord(c):x}_"
        for c in step_id
    )


def _mid(step_id: str) -> str:
    return _safe_id(step_id, ".")


def _mermaid_quote(text: str) -> str:
    return '"' + text.replace('"', "#quot;") + '"'


def to_mermaid(flow: Dataflow, recursive: bool = False) -> str:
    """A Mermaid ``flowchart TD`` of the flow's steps and the streams
    between them; a branch's edges are labelled ``trues`` / ``falses``.

    With ``recursive=True`` composite operators are subgraphs holding their
    inner steps, down to the core steps.
    """
    root, producer = _tree(flow)
    lines = ["flowchart TD", f"subgraph {_mid(root.step_id)}[{_mermaid_quote(root.step_id + ' (Dataflow)')}]"]

    def emit(node: _Node) -> None:
        if recursive and node.core is None:
            lines.append(f"subgraph {_mid(node.step_id)}[{_mermaid_quote(_label(node))}]")
            for child in node.children:
                emit(child)
            lines.append("end")
        else:
            lines.append(f"{_mid(node.step_id)}[{_mermaid_quote(_label(node))}]")

    for child in root.children:
        emit(child)
    for a, b, port in _edges(root, producer, recursive):
        arrow = f" -- {_mermaid_quote(port)} --> " if port else " --> "
        lines.append(f"{_mid(a)}{arrow}{_mid(b)}")
    lines.append("end")
    return "\n".join(lines)


def _puml_alias(step_id: str) -> str:
    return _safe_id(step_id, "")


def to_plantuml(flow: Dataflow, recursive: bool = False) -> str:
    """A PlantUML component diagram (``@startuml`` ... ``@enduml``) of the
    flow's steps and the streams between them.

    With ``recursive=True`` composite operators are drawn as components
    holding their inner steps, down to the core steps.
    """
    root, producer = _tree(flow)
    lines = ["@startuml", f"title Dataflow {root.step_id}"]

    def quote(text: str) -> str:
        return '"' + text.replace('"', "'") + '"'

    def emit(node: _Node, indent: str) -> None:
        head = f"{indent}component {quote(_label(node))} as {_puml_alias(node.step_id)}"
        if recursive and node.core is None and node.children:
            lines.append(head + " {")
            for child in node.children:
                emit(child, indent + "  ")
            lines.append(indent + "}")
        else:
            lines.append(head)

    for child in root.children:
        emit(child, "")
    for a, b, port in _edges(root, producer, recursive):
        label = f" : {port}" if port else ""
        lines.append(f"{_puml_alias(a)} --> {_puml_alias(b)}{label}")
    lines.append("@enduml")
    return "\n".join(lines)


_PROG = "python -m millpond.visualize"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> Any:
        sys.stderr.write(f"{_PROG}: error: {message}\n")
        sys.exit(2)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m millpond.visualize IMPORT_STR [--format F] [-r]``:
    print the flow's graph (Mermaid by default). Returns the exit status:
    0, or 2 with one ``error:`` line on stderr when the flow cannot be
    loaded."""
    parser = _Parser(
        prog=_PROG,
        description="Print a dataflow's step graph (Mermaid by default).",
    )
    parser.add_argument("import_str", metavar="IMPORT_STR", help="the flow, as for python -m millpond.run: MODULE_OR_PATH[:ATTR], ATTR defaults to 'flow'")
    parser.add_argument("-f", "--format", choices=["mermaid", "plantuml", "json"], default="mermaid", help="output format (default: mermaid)")
    parser.add_argument("-r", "--recursive", action="store_true", help="draw the steps inside composite operators too")
    args = parser.parse_args(argv)

    from millpond.importstr import ImportStringError, locate_dataflow

    try:
        flow = locate_dataflow(args.import_str)
    except ImportStringError as ex:
        sys.stderr.write(f"{_PROG}: error: {ex}\n")
        return 2
    if args.format == "json":
        text = to_json(flow)
    elif args.format == "plantuml":
        text = to_plantuml(flow, recursive=args.recursive)
    else:
        text = to_mermaid(flow, recursive=args.recursive)
    sys.stdout.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
