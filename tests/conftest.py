"""Shared pytest set-up: the ``slow`` marker, the fixtures of
``tests/helpers`` that many suites use, and the order in which modules are
handed to pytest-xdist's workers.

``make test`` (and CI) runs every test, on two xdist workers (``-n 2
--dist loadfile``); ``make test-fast`` skips the ones marked ``slow``
(crash loops, packaging builds, bounded-growth runs) for a quick edit loop.

Under xdist each test module is one unit of work: its tests run on one
worker, in order, so a module-scoped fixture (a built wheel, a reference
run, a killed run...) is made once, as in a serial run, and tests of one
module never run at the same time. Tests of different modules do: a test
must not use a fixed port or a fixed path outside its temp dirs. Session
fixtures (the S3 test server, the Kafka broker) are made once per worker.
"""

from __future__ import annotations

import signal
from typing import Generator, List

import pytest

from helpers.s3server import s3_server  # noqa: F401  (a session fixture for every suite)
from helpers.kafka import kafka_broker  # noqa: F401  (a real Kafka broker per worker, tools/kafka/broker.py)

# Several tests send SIGINT to a child Python and expect a KeyboardInterrupt
# (exit 130). A process started in the background by a non-interactive shell
# (`make test &`, nohup, some CI runners) inherits SIGINT ignored, and so
# would every child; Python only installs its handler when SIGINT is not
# ignored. Restoring the handler here gives the children the default
# disposition, whatever started pytest.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: a crash loop, a build or a long-running scale test; `make test-fast` skips these",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> Generator[None, None, None]:
    yield
    # After every other implementation (pytest's own reordering by fixture
    # included): the modules with tests marked slow first, each module's
    # tests kept together and in order. xdist (with --no-loadscope-reorder)
    # hands out modules in this order, so no long module starts last and
    # runs alone at the end. Every worker sorts the same way, as xdist needs.
    slow = {item.module.__name__ for item in items
            if getattr(item, "module", None) is not None and item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: 0 if getattr(item, "module", None) is not None and item.module.__name__ in slow else 1)


# Suites of stateful operators and recovery that also run under a live-key
# limit of 1 and of 10 (issue 13): the limit changes which keys are live,
# never what a flow outputs or commits. Each of their tests gets a
# ``[live=...]`` variant per limit; ``MILLPOND_MAX_LIVE_KEYS`` carries the
# limit to every run_main/cluster_main call in the test (children started
# with helpers.mpflow.child_env drop MILLPOND_* variables, so crash loops
# are not multiplied).
LIVE_LIMIT_MODULES = frozenset({
    "test_operators_stateful",
    "test_engine_recovery",
    "test_recovery_e2e",
    "test_windowing",
    "test_windowing_recovery",
    "test_peer_semantics",
})
LIVE_LIMITS = (None, 1, 10)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "live_key_limit" in metafunc.fixturenames and metafunc.module.__name__ in LIVE_LIMIT_MODULES:
        metafunc.parametrize("live_key_limit", LIVE_LIMITS, indirect=True,
                             ids=[f"live={limit}" for limit in LIVE_LIMITS])


@pytest.fixture(autouse=True)
def live_key_limit(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> "int | None":
    """The live-key limit the test's flows run with (``None``: unbounded)."""
    limit = getattr(request, "param", None)
    if limit is None:
        monkeypatch.delenv("MILLPOND_MAX_LIVE_KEYS", raising=False)
    else:
        monkeypatch.setenv("MILLPOND_MAX_LIVE_KEYS", str(limit))
    return limit
