"""The examples in millpond's docstrings run and print what they show."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import millpond


def _modules_with_examples() -> list[str]:
    names = []
    for info in pkgutil.walk_packages(millpond.__path__, "millpond."):
        if info.name.endswith("._core"):
            continue
        spec = importlib.util.find_spec(info.name)
        if spec and spec.origin and spec.origin.endswith(".py") and ">>> " in open(spec.origin).read():
            names.append(info.name)
    return sorted(names)


def test_the_examples_are_found():
    assert {"millpond.state", "millpond.logic", "millpond.engine.main", "millpond.testing"} <= set(_modules_with_examples())


@pytest.mark.parametrize("name", _modules_with_examples())
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed"
