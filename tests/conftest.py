"""Shared pytest set-up: the ``slow`` marker, the fixtures of
``tests/helpers`` that many suites use, and what running the suite on
several workers (pytest-xdist, ``make test``) needs.

``make test`` (and CI) runs every test, on two xdist workers (``-n 2
--dist loadgroup``); ``make test-fast`` skips the ones marked ``slow``
(crash loops, packaging builds, bounded-growth runs) for a quick edit loop.

Under xdist:

- A module whose tests share a module- or class-scoped fixture (a built
  wheel, a reference run, a killed run...) is one unit of work: its tests run
  on one worker, so the fixture is made once, as in a serial run. This is
  found from the fixtures themselves; a test module can also say so with
  ``pytestmark = pytest.mark.xdist_group("NAME")`` (e.g. for tests that
  share a resource outside the process, such as a fixed port or file).
- Modules with tests marked ``slow`` are handed out first, so that no long
  test starts last and runs alone at the end.
- Session fixtures (the S3 test server) are made once per worker.
"""

from __future__ import annotations

import signal
from typing import Generator, List

import pytest

from helpers.s3server import s3_server  # noqa: F401  (a session fixture for every suite)

# Several tests send SIGINT to a child Python and expect a KeyboardInterrupt
# (exit 130). A process started in the background by a non-interactive shell
# (`make test &`, nohup, some CI runners) inherits SIGINT ignored, and so
# would every child; Python only installs its handler when SIGINT is not
# ignored. Restoring the handler here gives the children the default
# disposition, whatever started pytest.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

SHARED_SCOPES = ("class", "module", "package")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "slow: a crash loop, a build or a long-running scale test; `make test-fast` skips these",
    )


def _shares_fixtures(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in SHARED_SCOPES for defs in info.name2fixturedefs.values() for d in defs)


@pytest.hookimpl(hookwrapper=True)
def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> Generator[None, None, None]:
    # Before the other implementations: xdist's (on a worker) turns the
    # xdist_group marks into the work units of --dist loadgroup.
    grouped = {item.module.__name__ for item in items
               if isinstance(item, pytest.Function) and _shares_fixtures(item)}
    for item in items:
        module = getattr(item, "module", None)
        if module is not None and module.__name__ in grouped and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(module.__name__))
    yield
    # After them (pytest's own reordering by fixture included): modules
    # with slow tests first, each module's tests kept together and in order.
    # Every worker collects and sorts the same way, as xdist requires.
    slow = {item.module.__name__ for item in items
            if getattr(item, "module", None) is not None and item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: 0 if getattr(item, "module", None) is not None and item.module.__name__ in slow else 1)
