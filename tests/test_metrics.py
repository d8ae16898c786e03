"""The Prometheus endpoint (``--metrics-port``, ``millpond.metrics``).

Runs real flows with recovery on, scrapes ``/metrics`` while they run and
parses what comes back with prometheus_client's own parser; checks that
the figures move, that the server listens on 127.0.0.1 only and is gone
after the run, and the errors: prometheus-client missing, a bad port, a
port in use.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

import pytest
from prometheus_client.parser import text_string_to_metric_families

from helpers import metricsflows
from millpond.engine.stats import LatencyHistogram, SourceLags
from millpond.recovery import RecoveryConfig
from millpond.testing import run_main

HELPERS = Path(__file__).parent / "helpers"
REPO = Path(__file__).resolve().parent.parent

Samples = Dict[Tuple[str, Tuple[Tuple[str, str], ...]], float]


def scrape(url: str) -> Tuple[Samples, Dict[str, str]]:
    """Every sample of ``url`` by (name, sorted labels), and each family's type."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    samples: Samples = {}
    types: Dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def value(samples: Samples, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    assert key in samples, f"{name}{labels} not scraped; have {sorted(n for n, _ in samples)}"
    return samples[key]


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over the samples that have ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


class _URL(logging.Handler):
    """Catches the ``metrics at URL`` log line of the run."""

    def __init__(self, flow_id: str = "metrics_flow") -> None:
        super().__init__()
        self.flow_id = flow_id
        self.urls: List[str] = []
        self.got = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        m = re.fullmatch(r"flow '(\w+)': metrics at (http://\S+/metrics)", record.getMessage())
        if m and m.group(1) == self.flow_id:
            self.urls.append(m.group(2))
            self.got.set()


class RunInThread:
    """``run_main(flow, **kwargs)`` in a thread; the test scrapes meanwhile."""

    def __init__(self, flow: object, flow_id: str = "metrics_flow", **kwargs: object) -> None:
        self.error: Optional[BaseException] = None
        self.handler = _URL(flow_id)
        logging.getLogger("millpond").addHandler(self.handler)
        logging.getLogger("millpond").setLevel(logging.INFO)

        def target() -> None:
            try:
                run_main(flow, **kwargs)  # type: ignore[arg-type]
            except BaseException as ex:  # noqa: BLE001 - reported by join
                self.error = ex

        self.thread = threading.Thread(target=target, daemon=True)
        self.thread.start()

    def url(self) -> str:
        assert self.handler.got.wait(30), "no 'metrics at URL' log line"
        return self.handler.urls[0]

    def join(self) -> None:
        self.thread.join(60)
        logging.getLogger("millpond").removeHandler(self.handler)
        assert not self.thread.is_alive(), "the run did not end"
        if self.error is not None:
            raise self.error


def wait_for(pred: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def refused(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def test_scrape_during_a_run_counters_move_and_parse(tmp_path):
    stop = threading.Event()
    out: list = []
    flow = metricsflows.get_flow(total=10**6, delay=0.005, stop=stop, out=out)
    run = RunInThread(flow, epoch_interval=timedelta(seconds=0.1),
                      recovery_config=RecoveryConfig(tmp_path / "state"), metrics_port=0)
    try:
        url = run.url()
        assert url.startswith("http://127.0.0.1:")
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        assert port > 0

        def committed() -> float:
            return total(scrape(url)[0], "millpond_committed_epoch")

        wait_for(lambda: committed() >= 2)
        first, types = scrape(url)
        wait_for(lambda: committed() >= value(first, "millpond_committed_epoch", flow="metrics_flow") + 3)
        second, _ = scrape(url)

        def lag(samples: Samples) -> float:
            return total(samples, "millpond_source_lag", partition="p0")

        # Lags are asked at most once a second.
        wait_for(lambda: 0 < lag(scrape(url)[0]) < lag(first), timeout=10)
        third, _ = scrape(url)
    finally:
        stop.set()
        run.join()

    flow_id = "metrics_flow"
    w = {"flow": flow_id, "worker": "0"}
    # The types Prometheus sees.
    assert types["millpond_step_items_out"] == "counter"
    assert types["millpond_commit_latency_seconds"] == "histogram"
    assert types["millpond_epoch_close_seconds"] == "histogram"
    assert types["millpond_committed_epoch"] == "gauge"
    assert types["millpond_source_lag"] == "gauge"
    # Items: what the input emitted reached the stateful step and the sink.
    src_out = value(second, "millpond_step_items_out_total", step="metrics_flow.in", **w)
    assert src_out > value(first, "millpond_step_items_out_total", step="metrics_flow.in", **w) > 0
    # (A scrape may come while a batch is on its way: later steps lag by it.)
    count_in = value(second, "millpond_step_items_in_total", step="metrics_flow.count.stateful_batch", **w)
    assert src_out - 2 <= count_in <= src_out
    sink_in = value(second, "millpond_step_items_in_total", step="metrics_flow.out", **w)
    assert count_in - 2 <= sink_in <= count_in
    # Epochs and commits move.
    for name in ("millpond_worker_epoch", "millpond_worker_closed_epoch"):
        assert value(second, name, **w) > value(first, name, **w) >= 1
    assert value(second, "millpond_committed_epoch", flow=flow_id) > value(first, "millpond_committed_epoch", flow=flow_id)
    assert value(second, "millpond_commits_total", flow=flow_id) > value(first, "millpond_commits_total", flow=flow_id)
    closes = value(second, "millpond_epoch_close_seconds_count", **w)
    assert closes >= value(second, "millpond_worker_closed_epoch", **w)
    assert value(second, "millpond_epoch_close_seconds_bucket", le="+Inf", **w) == closes
    commits = value(second, "millpond_commit_latency_seconds_count", flow=flow_id)
    assert 0 < commits <= value(second, "millpond_commits_total", flow=flow_id)
    assert value(second, "millpond_commit_latency_seconds_sum", flow=flow_id) > 0
    buckets = sorted((float(dict(ls)["le"]), v) for (n, ls), v in second.items()
                     if n == "millpond_commit_latency_seconds_bucket")
    assert [v for _, v in buckets] == sorted(v for _, v in buckets), "cumulative buckets"
    # Snapshots and uploads.
    assert value(second, "millpond_snapshot_rows_total", **w) > value(first, "millpond_snapshot_rows_total", **w)
    assert 0 <= value(second, "millpond_snapshot_rows_copied_total", **w) + value(
        second, "millpond_snapshot_rows_ahead_total", **w) + value(
        second, "millpond_snapshot_rows_carried_total", **w) <= value(second, "millpond_snapshot_rows_total", **w)
    assert value(second, "millpond_snapshot_bytes_total", flow=flow_id) > 0
    assert value(second, "millpond_upload_bytes_total", flow=flow_id, kind="segment") > value(
        first, "millpond_upload_bytes_total", flow=flow_id, kind="segment")
    assert value(second, "millpond_upload_retries_total", flow=flow_id) == 0
    assert value(second, "millpond_commit_backpressure_seconds_total", flow=flow_id) >= 0
    # State and resume.
    assert value(second, "millpond_live_keys", **w) == 5  # the counts of k0..k4 (positions are not keyed state)
    store_dir = tmp_path / "state" / flow_id / "worker-0000"
    assert 0 < value(second, "millpond_local_store_bytes", **w) <= 2 * sum(
        f.stat().st_size for f in store_dir.iterdir() if f.is_file()) + 10**6
    assert value(second, "millpond_resume_info", flow=flow_id, worker="0", kind="fresh") == 1
    assert value(second, "millpond_resume_seconds", flow=flow_id) > 0
    # The source lag: the items each partition has left, going down.
    for part in ("p0", "p1"):
        labels = {"flow": flow_id, "step": "metrics_flow.in", "partition": part}
        assert 0 < value(third, "millpond_source_lag", **labels) < value(first, "millpond_source_lag", **labels)
    # The process collector is there too.
    assert total(second, "process_cpu_seconds_total") > 0

    # Listening on 127.0.0.1 only: another loopback address is refused ...
    assert refused("127.0.0.2", port)
    # ... and nothing listens once the run is over.
    assert refused("127.0.0.1", port)
    assert len(out) >= src_out, "the flow wrote a count per item"


WORKER0 = {"flow": "metrics_flow", "worker": "0"}


def _scrape_once_evicting(tmp_path: Path, metric: str, **bound: int) -> Tuple[Samples, Dict[str, str]]:
    """Run the slow flow with a live bound (``max_live_keys`` or
    ``max_live_bytes``) and scrape once ``metric`` has counted 3."""
    stop = threading.Event()
    flow = metricsflows.get_flow(total=10**6, delay=0.002, stop=stop, out=[])
    run = RunInThread(flow, epoch_interval=timedelta(seconds=0.1),
                      recovery_config=RecoveryConfig(tmp_path / "state"), metrics_port=0, **bound)
    try:
        url = run.url()
        wait_for(lambda: total(scrape(url)[0], metric, **WORKER0) >= 3)
        return scrape(url)
    finally:
        stop.set()
        run.join()


def test_live_key_limit_counters_move(tmp_path):
    """With --max-live-keys below the keys in use, evictions and the
    multi-gets that read keys back (and so their batch sizes) show."""
    samples, types = _scrape_once_evicting(tmp_path, "millpond_hydrations_total", max_live_keys=2)
    w = WORKER0
    assert types["millpond_hydrations"] == "counter"
    assert value(samples, "millpond_live_keys_limit", **w) == 2
    assert value(samples, "millpond_evicted_keys_total", **w) > 0
    calls = value(samples, "millpond_hydrations_total", **w)
    assert calls >= 3 and value(samples, "millpond_hydrated_keys_total", **w) > 0
    assert value(samples, "millpond_local_store_bytes", **w) > 0


def test_byte_budget_gauges(tmp_path):
    """With --max-live-bytes, the budget, the estimated live bytes (within
    it) and the key limit it works out to show."""
    samples, types = _scrape_once_evicting(tmp_path, "millpond_evicted_keys_total", max_live_bytes=900)
    w = WORKER0
    assert types["millpond_live_bytes"] == "gauge"
    assert value(samples, "millpond_live_bytes_limit", **w) == 900
    live_bytes, keys = value(samples, "millpond_live_bytes", **w), value(samples, "millpond_live_keys", **w)
    limit = value(samples, "millpond_live_keys_limit", **w)
    assert keys >= 1 and live_bytes > 0
    per_key = live_bytes / keys
    # The budget works out to fewer keys than the flow's five, within it.
    assert 1 <= limit < 5
    assert limit * per_key <= 900 * 1.01
    # The bound holds between activations: a scrape during one may also
    # see the keys of the batches in hand (one item from each of the two
    # partitions), so the gauge may pass the budget by those.
    assert keys <= limit + 2


def test_resume_kind_after_a_restart(tmp_path):
    state = RecoveryConfig(tmp_path / "state")
    run_main(metricsflows.get_flow(total=20, delay=0), epoch_interval=timedelta(0), recovery_config=state)
    stop = threading.Event()
    # A source with more items than the first run: the second goes on
    # from the first's positions.
    flow = metricsflows.get_flow(total=10**6, delay=0.005, stop=stop)
    run = RunInThread(flow, epoch_interval=timedelta(seconds=0.1), recovery_config=state, metrics_port=0)
    try:
        url = run.url()
        wait_for(lambda: total(scrape(url)[0], "millpond_committed_epoch") > 0)
        samples, _ = scrape(url)
    finally:
        stop.set()
        run.join()
    assert value(samples, "millpond_resume_info", flow="metrics_flow", worker="0", kind="fast") == 1
    assert value(samples, "millpond_execution", flow="metrics_flow") == 1
    # Five counts and two positions (a fast resume may also count older
    # versions not yet collected, and then leaves the keys out).
    assert value(samples, "millpond_resume_rows", flow="metrics_flow", worker="0") >= 5 + 2
    assert total(samples, "millpond_resume_keys") in (0, 5 + 2)
    assert value(samples, "millpond_resume_epoch", flow="metrics_flow") > 1


def test_source_lag_only_for_partitions_with_a_working_lag(tmp_path, caplog):
    stop = threading.Event()
    flow = metricsflows.get_flow(total=10**6, delay=0.005, stop=stop, parts=["p0", "nolag", "broken"])
    run = RunInThread(flow, epoch_interval=timedelta(seconds=0.1), metrics_port=0)  # recovery off
    try:
        url = run.url()
        wait_for(lambda: total(scrape(url)[0], "millpond_worker_closed_epoch") >= 2)
        samples, _ = scrape(url)
    finally:
        stop.set()
        run.join()
    lags = {dict(ls)["partition"]: v for (n, ls), v in samples.items() if n == "millpond_source_lag"}
    assert set(lags) == {"p0"}, lags
    assert 0 < lags["p0"] < 10**6
    assert "lag() raised" in caplog.text and "'broken'" in caplog.text
    # Without recovery there is nothing committed to report.
    assert total(samples, "millpond_committed_epoch") == 0
    assert not any(n.startswith("millpond_commit") for n, _ in samples)


def test_two_runs_at_once_each_have_their_own_endpoint(tmp_path):
    stops = [threading.Event(), threading.Event()]
    runs = [RunInThread(metricsflows.get_flow(total=10**6, delay=0.005, stop=s, flow_id=f"flow{i}"),
                        epoch_interval=timedelta(seconds=0.1), recovery_config=RecoveryConfig(tmp_path / f"s{i}"),
                        metrics_port=0, flow_id=f"flow{i}")
            for i, s in enumerate(stops)]
    try:
        urls = [r.url() for r in runs]
        assert urls[0] != urls[1]
        for i, url in enumerate(urls):
            wait_for(lambda: total(scrape(url)[0], "millpond_committed_epoch", flow=f"flow{i}") >= 1)
            assert not any(dict(ls)["flow"] != f"flow{i}" for n, ls in scrape(url)[0] if n.startswith("millpond_"))
    finally:
        for s in stops:
            s.set()
        for r in runs:
            r.join()


def test_no_port_serves_nothing_and_keeps_the_run_as_it_was(tmp_path):
    out: list = []
    handler = _URL()
    logging.getLogger("millpond").addHandler(handler)
    try:
        run_main(metricsflows.get_flow(total=10, delay=0, out=out), epoch_interval=timedelta(0))
    finally:
        logging.getLogger("millpond").removeHandler(handler)
    assert not handler.urls
    assert len(out) == 20


def test_histogram_and_lags_by_hand():
    h = LatencyHistogram((0.1, 1.0))
    for s in (0.1, 0.2, 5.0):
        h.observe(s)
    assert h.cumulative() == [(0.1, 1), (1.0, 2), (float("inf"), 3)]
    lags = SourceLags()
    assert not lags.due()  # off until a metrics endpoint asks
    lags.enabled = True
    assert lags.due()

    class P:
        def __init__(self, v: object) -> None:
            self.v = v

        def lag(self) -> object:
            return self.v

    lags.sample([("s", "a", P(3)), ("s", "b", P(None)), ("s", "c", P("x")), ("s", "d", object())])
    assert lags.values == {("s", "a"): 3.0}
    assert not lags.due()  # at most once a second


# --- the command line ----------------------------------------------------------


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MILLPOND_")}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "tests"), env.get("PYTHONPATH", "")])
    env.update(extra)
    return env


def _flow_arg(total: int, delay: float) -> str:
    return f"{HELPERS / 'metricsflows.py'}:get_flow({total}, {delay})"


def test_cli_metrics_port_zero_logs_the_url_and_serves_while_running(tmp_path):
    cmd = [sys.executable, "-m", "millpond.run", _flow_arg(300, 0.01), "-s", "0.1", "-d", str(tmp_path / "st"),
           "--metrics-port", "0"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=_env(),
                            cwd=tmp_path)
    lines: List[str] = []
    got = threading.Event()

    def read() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append(line)
            if "': metrics at http://" in line:
                got.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert got.wait(30), "".join(lines)
        url = re.search(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", "".join(lines)).group(1)  # type: ignore[union-attr]
        wait_for(lambda: total(scrape(url)[0], "millpond_committed_epoch") >= 1)
        first, _ = scrape(url)
        wait_for(lambda: total(scrape(url)[0], "millpond_committed_epoch") >= total(first, "millpond_committed_epoch") + 2)
        second, _ = scrape(url)
        assert proc.wait(60) == 0, "".join(lines)
    finally:
        if proc.poll() is None:
            proc.kill()
        reader.join(10)
    assert total(second, "millpond_step_items_out_total", step="metrics_flow.in") > total(
        first, "millpond_step_items_out_total", step="metrics_flow.in")
    port = int(url.rsplit(":", 1)[1].split("/")[0])
    assert refused("127.0.0.1", port)


def test_cli_cluster_processes_each_serve_their_own_port(tmp_path):
    cmd = [sys.executable, "-m", "millpond.run", _flow_arg(40, 0.01), "-s", "0.1", "-p", "2", "--metrics-port", "0"]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=tmp_path, timeout=120)
    assert res.returncode == 0, res.stderr
    urls = re.findall(r"metrics at (http://127\.0\.0\.1:\d+/metrics)", res.stderr)
    assert len(urls) == 2 and urls[0] != urls[1], res.stderr


def test_cli_without_prometheus_client_says_which_extra_to_install(tmp_path):
    # prometheus_client blocked: importing it raises ImportError.
    block = "import sys; sys.modules['prometheus_client'] = None; from millpond.run import main; "
    code = block + f"sys.exit(main([{_flow_arg(5, 0)!r}, '--metrics-port', '0']))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=tmp_path,
                         timeout=60)
    assert res.returncode == 2, res.stderr
    errors = [ln for ln in res.stderr.splitlines() if "error" in ln]
    assert errors == [
        "python -m millpond.run: error: --metrics-port 0: serving metrics needs the prometheus-client package, "
        "which is not installed: pip install 'millpond[metrics]'"
    ], res.stderr
    # Without a port nothing imports it, and the flow runs.
    code = block + f"rc = main([{_flow_arg(5, 0)!r}]); assert 'millpond.metrics' not in sys.modules; sys.exit(rc)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), cwd=tmp_path,
                         timeout=60)
    assert res.returncode == 0, res.stderr
    # From Python: an ImportError with the same words.
    code = ("import sys; sys.modules['prometheus_client'] = None\n"
            "from helpers.metricsflows import get_flow\nfrom millpond.testing import run_main\n"
            "try:\n    run_main(get_flow(5, 0), metrics_port=0)\nexcept ImportError as ex:\n    print(ex)\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=_env(), timeout=60)
    assert "pip install 'millpond[metrics]'" in res.stdout, res.stderr


@pytest.mark.parametrize(
    "argv, env, message",
    [
        (["--metrics-port", "abc"], {}, "argument --metrics-port: expected a port from 0 to 65535 (0 picks a free one), got 'abc'"),
        (["--metrics-port", "65536"], {}, "expected a port from 0 to 65535"),
        (["--metrics-port=-1"], {}, "expected a port from 0 to 65535"),
        ([], {"MILLPOND_METRICS_PORT": "x9"}, "MILLPOND_METRICS_PORT='x9': expected a port from 0 to 65535"),
        (["--metrics-address", "0.0.0.0"], {}, "--metrics-address 0.0.0.0 needs --metrics-port N"),
        (["-p", "2", "--metrics-port", "65535"], {}, "process i serves port N+i, which goes past 65535"),
    ],
)
def test_cli_bad_metrics_settings_exit_2(tmp_path, argv, env, message):
    res = subprocess.run([sys.executable, "-m", "millpond.run", _flow_arg(5, 0), *argv], capture_output=True,
                         text=True, env=_env(**env), cwd=tmp_path, timeout=60)
    assert res.returncode == 2, res.stderr
    assert message in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr


def test_cli_port_in_use_exit_2(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        res = subprocess.run([sys.executable, "-m", "millpond.run", _flow_arg(5, 0), "--metrics-port", str(port),
                              "-d", str(tmp_path / "st")], capture_output=True, text=True, env=_env(), cwd=tmp_path,
                             timeout=60)
    assert res.returncode == 2, res.stderr
    assert f"error: --metrics-port {port}: cannot serve metrics on 127.0.0.1:{port}: Address already in use" in res.stderr
    assert not (tmp_path / "st" / "metrics_flow").exists(), "nothing ran"
