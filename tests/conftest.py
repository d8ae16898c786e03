"""Shared pytest set-up: the ``slow`` marker and the fixtures of
``tests/helpers`` that many suites use.

``make test`` (and CI) runs every test; ``make test-fast`` skips the ones
marked ``slow`` (crash loops, packaging builds, bounded-growth runs) for a
quick edit loop.
"""

from __future__ import annotations

import pytest

from helpers.s3server import s3_server  # noqa: F401  (a session fixture for every suite)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: a crash loop, a build or a long-running scale test; `make test-fast` skips these",
    )
