"""millpond.visualize: the step graph of a flow with a branch, a merge and
nested composite steps, as JSON, Mermaid and PlantUML, and the CLI."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.testing import TestingSink, TestingSource
from millpond.visualize import to_json, to_mermaid, to_plantuml

REPO = Path(__file__).resolve().parents[1]

FLOW_SRC = textwrap.dedent(
    """
    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.testing import TestingSink, TestingSource

    flow = Dataflow("vis")
    nums = op.input("inp", flow, TestingSource(list(range(10))))
    b = op.branch("evens", nums, lambda x: x % 2 == 0)
    dbl = op.map("double", b.trues, lambda x: 2 * x)
    keyed = op.key_on("key", b.falses, lambda x: "odd")
    cnt = op.count_final("my count", keyed, key=lambda kv: kv[0])
    m = op.merge("all", dbl, cnt)
    op.output("out", m, TestingSink([]))
    """
)


def make_flow() -> Dataflow:
    ns: dict = {}
    exec(FLOW_SRC, ns)
    return ns["flow"]


def test_json_nests_steps_and_links_streams():
    doc = json.loads(to_json(make_flow()))
    assert doc["flow_id"] == "vis"
    top = {s["step_name"]: s for s in doc["substeps"]}
    assert list(top) == ["inp", "evens", "double", "key", "my count", "all", "out"]
    assert top["inp"]["kind"] == "input" and top["inp"]["inputs"] == []
    assert top["evens"]["outputs"] == ["vis.evens.trues", "vis.evens.falses"]
    assert top["double"]["kind"] == "composite"
    assert top["double"]["inputs"] == ["vis.evens.trues"]
    assert top["key"]["inputs"] == ["vis.evens.falses"]
    # the merge reads both composites' outputs
    assert top["all"]["inputs"] == top["double"]["outputs"] + top["my count"]["outputs"]
    assert top["out"]["inputs"] == top["all"]["outputs"] and top["out"]["outputs"] == []
    # nesting: count_final -> init_count + fold_final "sum" -> stateful_batch
    count = top["my count"]
    assert [s["step_name"] for s in count["substeps"]] == ["init_count", "sum"]
    sum_step = count["substeps"][1]
    assert sum_step["substeps"][0]["step_id"] == "vis.my count.sum.stateful_batch"
    assert sum_step["substeps"][0]["kind"] == "stateful_batch"
    # the inner stream between init_count and sum is not an input of "my count"
    assert count["inputs"] == ["vis.key.flat_map_batch.down"]
    assert count["outputs"] == ["vis.my count.sum.stateful_batch.down"]


def test_every_input_is_some_steps_output():
    doc = json.loads(to_json(make_flow()))
    outs, ins = set(), set()

    def walk(steps):
        for s in steps:
            outs.update(s["outputs"])
            ins.update(s["inputs"])
            walk(s["substeps"])

    walk(doc["substeps"])
    assert ins <= outs


def test_mermaid_top_level():
    text = to_mermaid(make_flow())
    lines = text.splitlines()
    assert lines[0] == "flowchart TD"
    assert lines[1] == 'subgraph vis["vis (Dataflow)"]'
    assert lines[-1] == "end"
    assert 'vis.evens["evens (branch)"]' in lines
    assert 'vis.my_20_count["my count"]' in lines  # the space is escaped in the id
    edges = [ln for ln in lines if "-->" in ln]
    assert edges == [
        "vis.inp --> vis.evens",
        'vis.evens -- "trues" --> vis.double',
        'vis.evens -- "falses" --> vis.key',
        "vis.key --> vis.my_20_count",
        "vis.double --> vis.all",
        "vis.my_20_count --> vis.all",
        "vis.all --> vis.out",
    ]
    # no inner step is drawn
    assert "flat_map_batch" not in text


def test_mermaid_recursive_draws_subgraphs():
    text = to_mermaid(make_flow(), recursive=True)
    assert 'subgraph vis.my_20_count["my count"]' in text
    assert 'subgraph vis.my_20_count.sum["sum"]' in text
    assert 'vis.my_20_count.sum.stateful_batch["stateful_batch"]' in text
    assert "vis.my_20_count.init_count --> vis.my_20_count.sum.stateful_batch" in text
    assert text.count("subgraph") == text.count("\nend")


def test_plantuml():
    text = to_plantuml(make_flow())
    lines = text.splitlines()
    assert lines[0] == "@startuml" and lines[-1] == "@enduml"
    assert 'component "evens (branch)" as vis_2e_evens' in lines
    assert "vis_2e_evens --> vis_2e_double : trues" in lines
    assert "vis_2e_double --> vis_2e_all" in lines
    assert "vis_2e_my_20_count --> vis_2e_all" in lines
    assert "{" not in text
    nested = to_plantuml(make_flow(), recursive=True)
    assert 'component "my count" as vis_2e_my_20_count {' in nested
    assert nested.count("{") == nested.count("}") == 4  # double, key, my count, sum
    assert "vis_2e_evens --> vis_2e_key_2e_flat_map_batch : falses" in nested


def test_not_a_flow_is_a_type_error():
    with pytest.raises(TypeError, match="Dataflow"):
        to_mermaid("flow")  # type: ignore[arg-type]


def test_a_flow_still_runs_after_drawing():
    from millpond.testing import run_main

    flow = Dataflow("again")
    out: list = []
    op.output("out", op.map("inc", op.input("inp", flow, TestingSource([1, 2])), lambda x: x + 1), TestingSink(out))
    to_json(flow), to_mermaid(flow, recursive=True), to_plantuml(flow, recursive=True)
    run_main(flow)
    assert out == [2, 3]


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "millpond.visualize", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )


def test_cli_prints_mermaid(tmp_path):
    (tmp_path / "vflow.py").write_text(FLOW_SRC)
    res = _cli(tmp_path, "vflow.py")
    assert res.returncode == 0, res.stderr
    assert res.stdout == to_mermaid(make_flow()) + "\n"
    res = _cli(tmp_path, "vflow:flow", "--format", "plantuml", "--recursive")
    assert res.returncode == 0, res.stderr
    assert res.stdout == to_plantuml(make_flow(), recursive=True) + "\n"
    res = _cli(tmp_path, "vflow.py", "-f", "json")
    assert json.loads(res.stdout) == json.loads(to_json(make_flow()))


@pytest.mark.parametrize(
    "import_str, message",
    [
        ("missing.py", "no such file: missing.py"),
        ("vflow.py:nope", "has no attribute 'nope'"),
        ("vflow.py:op", "not a millpond.dataflow.Dataflow"),
    ],
)
def test_cli_bad_import_string_is_one_error_line(tmp_path, import_str, message):
    (tmp_path / "vflow.py").write_text(FLOW_SRC)
    res = _cli(tmp_path, import_str)
    assert res.returncode == 2
    assert res.stdout == ""
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith("python -m millpond.visualize: error: ")
    assert message in lines[0]
