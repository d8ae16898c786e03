"""What the "never silently wrong" checks (issue #16) cost: two trees, same harness.

Runs the code before the checks (a baseline tree, e.g. a worktree at commit
``480cb60`` with its own build of the extension) and the current code side by
side, in the same session, alternating which tree goes first round by round,
each in its own subprocess with ``PYTHONPATH`` at that tree's ``pysrc``; the
flows are the ones in this file, so both trees run exactly the same thing.
What the checks added: a CRC-32C per row of every snapshot file (written, and
checked on every read), row-order checks on scans, a background full check of
every fast-resumed local store that commits wait for, a listing of the flow's
objects before each commit, HMAC when a key is set (none is set here).

Figures (baseline, current, current/baseline per round and the median):

1. word count (``count_final``, 1M words, 100k keys, ``TestingSource`` batch
   1000, epoch 1 s, DirBackup under the state dir), recovery off and recovery
   on in batch mode, in one process; the batch/off ratio of each side;
2. fast resume of 1M keys: ``python -m millpond.run`` of a per-key counter
   whose first execution stored 1M keys, process start to the first resumed
   output line (as ``bench/wordcount.py`` measures it);
3. the word count's shapes: 100, 10k, 100k and 1M distinct keys (1M keys:
   each of 1M words twice, shuffled, 2M words);
4. per-key hydration: after a fast resume of 1M keys, 100k stored keys in
   random order, each touched once by the ``stateful_map`` (a lookup in the
   local store each); time from the end of the resume to the last output;
   and the same lookups without the flow (``_core.store_get`` on the
   resumed run's store), at once and again 3 s later, when the background
   check is over;
5. full resume of 1M keys (the local store deleted, rebuilt from the
   backup), process start to the first resumed output;
6. after a fast resume of 1M keys, with items flowing (about 2.5k/s, epoch
   1 s): seconds from the end of the resume (and from process start) to the
   first commit of the new execution, and the background check's own time
   (the ``local store checked`` record of ``millpond.core`` at DEBUG; the
   baseline has no check).

Each resume trial starts from a fresh copy of a state made once per tree.
The machine is noisy: read the per-round ratios and their medians.

    python bench/checks_cost.py --baseline /work/base --current /work/cur --rounds 5
    python bench/checks_cost.py --baseline /work/base --quick      # 1 round, small sizes
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional

HERE = Path(__file__).resolve()
BATCH = 1000
FLOW_ID = "bench_checks_resume"

# -- flows (imported from the tree under test: PYTHONPATH) ---------------------

_SINK_TIMES: Dict[str, Any] = {"first": None, "last": None, "n": 0, "all": []}
_LIVE: Dict[str, Any] = {"stop": False}


def _key(w: str) -> str:
    return w


def _count(state: Optional[int], _value: Any) -> tuple:
    n = (state or 0) + 1
    return n, n


def _resumed(kv: tuple) -> bool:
    return kv[1] >= 2


def resume_keys(n_keys: int) -> List[str]:
    return [f"key-{i:08d}" for i in range(n_keys)]


def _live_items(keys: List[str]) -> Iterator[str]:
    """Keys already stored, about 2.5k a second, until told to stop (60 s at most)."""
    t_end = time.monotonic() + 60
    for i in itertools.count():
        if _LIVE["stop"] or time.monotonic() > t_end:
            return
        yield keys[(i * 7919) % len(keys)]
        if i % 50 == 49:
            time.sleep(0.02)


def resume_flow(n_keys: int, phase: int = 0, n_touch: int = 0, seed: int = 11) -> Any:
    """A per-key counter over ``n_keys`` keys, then EOF (the first execution
    ends there). What follows, for the resumed execution, depends on ``phase``:
    0 one stored key (its count 2 is the line printed); 1 ``n_touch`` stored
    keys in random order, counted by a timing sink; 2 stored keys flowing
    until :data:`_LIVE` says stop."""
    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.outputs import DynamicSink, StatelessSinkPartition
    from millpond.testing import TestingSource

    keys = resume_keys(n_keys)
    head: List[Any] = keys + [TestingSource.EOF()]
    if phase == 0:
        items: Any = head + [keys[0]]
        batch = BATCH
    elif phase == 1:
        sample = random.Random(seed).sample(keys, n_touch)
        items = head + sample
        batch = BATCH
    else:
        items = itertools.chain(head, _live_items(keys))
        batch = 50

    class _Print(StatelessSinkPartition):
        def write_batch(self, batch_items: List[Any]) -> None:
            for k, n in batch_items:
                print(k, n, flush=True)

    class _Timed(StatelessSinkPartition):
        def write_batch(self, batch_items: List[Any]) -> None:
            now = time.monotonic()
            if _SINK_TIMES["first"] is None:
                _SINK_TIMES["first"] = now
            _SINK_TIMES["last"] = now
            _SINK_TIMES["n"] += len(batch_items)
            _SINK_TIMES["all"].append(now)

    class _Sink(DynamicSink):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            return _Print() if phase == 0 else _Timed()

    flow = Dataflow(FLOW_ID)
    s = op.input("inp", flow, TestingSource(items, batch_size=batch))
    counts = op.stateful_map("count", op.key_on("key", s, _key), _count)
    op.output("out", op.filter("resumed", counts, _resumed), _Sink())
    return flow


def wordcount_words(n_keys: int, n_words: int, seed: int) -> List[str]:
    rnd = random.Random(seed)
    if n_words <= 0:  # every key twice, shuffled
        words = [f"w{i:07d}" for i in range(n_keys)] * 2
        rnd.shuffle(words)
        return words
    return [f"w{rnd.randrange(n_keys):07d}" for _ in range(n_words)]


# -- children (run with the tree under test on PYTHONPATH) ---------------------


def child_wordcount(a: dict) -> dict:
    from datetime import timedelta

    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.outputs import DynamicSink, StatelessSinkPartition
    from millpond.recovery import RecoveryConfig, SnapshotMode
    from millpond.testing import TestingSource, run_main

    words = wordcount_words(a["keys"], a["words"], a["seed"])
    box = [0]

    class _Count(StatelessSinkPartition):
        def write_batch(self, items: List[Any]) -> None:
            box[0] += len(items)

    class _Sink(DynamicSink):
        def build(self, step_id: str, worker_index: int, worker_count: int) -> Any:
            return _Count()

    out: Dict[str, Any] = {"words": len(words), "off": [], "batch": []}
    modes = ["off", "batch"] if a["off_first"] else ["batch", "off"]
    for _ in range(a["pairs"]):
        for mode in modes:
            flow = Dataflow("bench_checks_wc")
            s = op.input("inp", flow, TestingSource(words, batch_size=BATCH))
            op.output("out", op.count_final("count", s, _key), _Sink())
            cfg = None
            state = None
            if mode == "batch":
                state = Path(tempfile.mkdtemp(prefix="mp-checks-wc-", dir=a["tmp"]))
                cfg = RecoveryConfig(state, snapshot_mode=SnapshotMode.BATCH)
            box[0] = 0
            t0 = time.perf_counter()
            run_main(flow, epoch_interval=timedelta(seconds=1), recovery_config=cfg)
            out[mode].append(time.perf_counter() - t0)
            out["out"] = box[0]
            if state is not None:
                shutil.rmtree(state, ignore_errors=True)
    return out


def _capture_runs() -> Dict[str, Any]:
    """Patch RecoveryRun so the child sees the run it opened and when."""
    from millpond.engine import recovery_run as rr

    seen: Dict[str, Any] = {}
    orig = rr.RecoveryRun.__init__

    def init(self: Any, *args: Any, **kw: Any) -> None:
        orig(self, *args, **kw)
        seen["run"] = self
        seen["resumed_at"] = time.monotonic()
        if "on_open" in seen:
            seen["on_open"](self)

    orig_finish = rr.RecoveryRun.finish

    def finish(self: Any, aborted: bool) -> None:
        orig_finish(self, aborted)
        seen["metrics"] = self.metrics()

    rr.RecoveryRun.__init__ = init  # type: ignore[method-assign]
    rr.RecoveryRun.finish = finish  # type: ignore[method-assign]
    return seen


class _CoreRecords(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: List[tuple] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append((time.monotonic(), record.getMessage()))


def child_hydrate(a: dict) -> dict:
    from datetime import timedelta

    from millpond.recovery import RecoveryConfig, SnapshotMode
    from millpond.testing import run_main

    seen = _capture_runs()
    flow = resume_flow(a["keys"], 1, a["touch"], a["seed"])
    cfg = RecoveryConfig(Path(a["state"]), snapshot_mode=SnapshotMode.BATCH)
    t0 = time.monotonic()
    run_main(flow, epoch_interval=timedelta(seconds=1), recovery_config=cfg)
    t1 = time.monotonic()
    run = seen["run"]
    ts = [seen["resumed_at"]] + _SINK_TIMES["all"]
    gaps = sorted(b - a for a, b in zip(ts, ts[1:]))
    typical = statistics.median(gaps) if gaps else 0.0
    m = seen.get("metrics", {})
    return {"touched": _SINK_TIMES["n"], "resume_s": run.resume_seconds,
            "batch_gap_p50_s": typical, "stalls_s": sum(g - typical for g in gaps if g > 3 * typical),
            "local_write_s": m.get("local_write_seconds"), "backpressure_s": m.get("backpressure_seconds"),
            "commits": m.get("commits"), "commit_p50_s": m.get("commit_latency_p50"),
            "metrics": {k: v for k, v in m.items() if k != "commit_latencies"},
            "touch_s": _SINK_TIMES["last"] - seen["resumed_at"],
            "run_s": t1 - t0, "since_start_s": t1 - a["t_start"],
            "kinds": sorted({str(r["kind"]) for r in run.restores})}


def child_live(a: dict) -> dict:
    from datetime import timedelta

    from millpond.recovery import RecoveryConfig, SnapshotMode
    from millpond.testing import run_main

    core_log = logging.getLogger("millpond.core")
    rec = _CoreRecords()
    core_log.addHandler(rec)
    core_log.setLevel(logging.DEBUG)
    core_log.propagate = False
    seen = _capture_runs()
    res: Dict[str, Any] = {}

    def watch(run: Any) -> None:
        start_epoch = run.committed_epoch
        t_end = time.monotonic() + 60
        while time.monotonic() < t_end:
            try:
                m = run.metrics()
            except Exception:  # noqa: BLE001 - the run went away
                return
            if m and m["committed_epoch"] > start_epoch:
                res["commit_at"] = time.monotonic()
                res["committed_epoch"] = m["committed_epoch"]
                res["from_epoch"] = start_epoch
                # Let a few more epochs through, then end the input.
                time.sleep(a["after"])
                _LIVE["stop"] = True
                return
            time.sleep(0.005)
        _LIVE["stop"] = True

    seen["on_open"] = lambda run: threading.Thread(target=watch, args=(run,), daemon=True).start()
    flow = resume_flow(a["keys"], 2)
    cfg = RecoveryConfig(Path(a["state"]), snapshot_mode=SnapshotMode.BATCH)
    t0 = time.monotonic()
    run_main(flow, epoch_interval=timedelta(seconds=1), recovery_config=cfg)
    t1 = time.monotonic()
    run = seen["run"]
    checked = [(t, m) for t, m in rec.records if "local store checked" in m]
    verify_s = None
    if checked:
        mm = re.search(r"seconds[=:\s]+([0-9.eE+-]+)", checked[0][1])
        verify_s = float(mm.group(1)) if mm else None
    out = {"resume_s": run.resume_seconds, "run_s": t1 - t0,
           "kinds": sorted({str(r["kind"]) for r in run.restores}),
           "verify_s": verify_s, "verify_log": checked[0][1] if checked else None,
           "checked_after_resume_s": (checked[0][0] - seen["resumed_at"]) if checked else None}
    if "commit_at" in res:
        out["first_commit_after_resume_s"] = res["commit_at"] - seen["resumed_at"]
        out["first_commit_since_start_s"] = res["commit_at"] - a["t_start"]
        out["committed_epoch"] = res["committed_epoch"]
    return out


def child_lookups(a: dict) -> dict:
    """Lookups without the flow: open the run (a fast resume), then time
    ``store_get`` of ``touch`` stored keys in random order twice: at once
    (beside the background check, in the current code) and after ``wait``
    seconds (the check done)."""
    from millpond import _core
    from millpond.engine.recovery_run import open_recovery_run
    from millpond.recovery import RecoveryConfig, SnapshotMode

    cfg = RecoveryConfig(Path(a["state"]), snapshot_mode=SnapshotMode.BATCH)
    run = open_recovery_run(cfg, FLOW_ID, 1)
    out: Dict[str, Any] = {"resume_s": run.resume_seconds}
    try:
        h = run.worker_store(0)._require_handle()
        step = next(s for s in _core.store_steps(h) if ".count" in s)
        keys = resume_keys(a["keys"])
        for name, seed, wait in (("at_once", a["seed"], 0.0), ("after_wait", a["seed"] + 1, a["wait"])):
            time.sleep(wait)
            sample = random.Random(seed).sample(keys, a["touch"])
            t0 = time.perf_counter()
            for k in sample:
                if _core.store_get(h, step, k) is None:
                    raise RuntimeError(f"{k} not found")
            out[name + "_s"] = time.perf_counter() - t0
    finally:
        run.finish(True)
        run.close()
    return out


CHILDREN = {"wordcount": child_wordcount, "hydrate": child_hydrate, "live": child_live, "lookups": child_lookups}


# -- parent ----------------------------------------------------------------------


class Tree:
    def __init__(self, name: str, root: Path, python: str) -> None:
        self.name = name
        self.root = root
        self.python = python
        self.env = {**os.environ, "PYTHONPATH": str(root / "pysrc")}
        self.env.pop("MILLPOND_BACKUP_KEY", None)
        self.env.pop("MILLPOND_BACKUP_KEY_FILE", None)

    def child(self, kind: str, args: dict, timeout: float = 900) -> dict:
        args = {**args, "t_start": time.monotonic()}
        r = subprocess.run([self.python, str(HERE), "--child", kind, json.dumps(args)], env=self.env,
                           capture_output=True, text=True, timeout=timeout, cwd=self.root)
        line = next((ln for ln in r.stdout.splitlines()[::-1] if ln.startswith("RESULT ")), None)
        if r.returncode != 0 or line is None:
            raise RuntimeError(f"{self.name} child {kind} exited {r.returncode}: {r.stderr[-3000:]}")
        return json.loads(line[len("RESULT "):])

    def cli(self, state: Path, n_keys: int) -> List[str]:
        return [self.python, "-m", "millpond.run", f"{HERE}:resume_flow({n_keys})", "-d", str(state), "-s", "1"]

    def first_line(self, state: Path, n_keys: int) -> dict:
        t0 = time.monotonic()
        proc = subprocess.Popen(self.cli(state, n_keys), cwd=self.root, env=self.env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = proc.stdout.readline()
            first = time.monotonic() - t0
            _, err = proc.communicate(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        total = time.monotonic() - t0
        if proc.returncode != 0 or not line.strip():
            raise RuntimeError(f"{self.name} resume exited {proc.returncode}, line {line!r}: {err[-3000:]}")
        log = [ln for ln in err.splitlines() if "resume flow" in ln][:1]
        return {"first_output_s": first, "process_s": total, "line": line.strip(), "log": log}


def fresh_copy(seed: Path, dest: Path) -> Path:
    if dest.exists():
        shutil.rmtree(dest)
    shutil.copytree(seed, dest, symlinks=True)
    return dest


def med(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", type=Path, default=Path("/work/base"),
                    help="tree of the code before the checks, with its extension built (default /work/base)")
    ap.add_argument("--current", type=Path, default=HERE.parent.parent,
                    help="tree of the current code, with its extension built (default: this file's tree)")
    ap.add_argument("--python", default=sys.executable, help="interpreter for both trees (default: this one)")
    ap.add_argument("--rounds", type=int, help="rounds, baseline and current alternating (default 3; --quick 1)")
    ap.add_argument("--quick", action="store_true",
                    help="200k words / 20k keys, shapes 100 / 10k / 100k keys, 100k resume keys, 10k touched, 1 round")
    ap.add_argument("--only", help="comma-separated figures to run: wc,shapes,fast,hydrate,lookups,full,live")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--tmp", type=Path, help="directory for the states (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "ARGS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)

    if args.child:
        kind, cargs = args.child
        res = CHILDREN[kind](json.loads(cargs))
        print("RESULT " + json.dumps(res), flush=True)
        return 0

    rounds = args.rounds or (1 if args.quick else 3)
    n_words, n_keys = (200_000, 20_000) if args.quick else (1_000_000, 100_000)
    shapes = [(100, n_words), (10_000, n_words), (100_000, 0)] if args.quick else \
        [(100, n_words), (10_000, n_words), (1_000_000, 0)]
    n_resume = 100_000 if args.quick else 1_000_000
    n_touch = 10_000 if args.quick else 100_000
    only = set(args.only.split(",")) if args.only else {"wc", "shapes", "fast", "hydrate", "lookups", "full", "live"}

    trees = [Tree("baseline", args.baseline.resolve(), args.python),
             Tree("current", args.current.resolve(), args.python)]
    for t in trees:
        if not any((t.root / "pysrc" / "millpond").glob("_core*.so")):
            ap.error(f"{t.root}: no built extension in pysrc/millpond")
    revs = {}
    for t in trees:
        r = subprocess.run(["git", "-C", str(t.root), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        revs[t.name] = r.stdout.strip()
    print(f"checks_cost: baseline {trees[0].root} ({revs['baseline']}), current {trees[1].root} "
          f"({revs['current']}); {rounds} round(s); nproc {os.cpu_count()}; "
          f"{time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)

    tmp_ctx = tempfile.TemporaryDirectory(prefix="mp-checks-cost-", dir=args.tmp)
    tmp = Path(tmp_ctx.name)
    data: Dict[str, Dict[str, List[Any]]] = {}

    def add(fig: str, tree: str, value: Any) -> None:
        data.setdefault(fig, {}).setdefault(tree, []).append(value)

    try:
        seeds: Dict[str, Path] = {}
        if only & {"fast", "hydrate", "lookups", "full", "live"}:
            for t in trees:
                seed = tmp / f"seed-{t.name}"
                seed.mkdir()
                t0 = time.monotonic()
                subprocess.run(t.cli(seed, n_resume), cwd=t.root, env=t.env, check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                seeds[t.name] = seed
                size = sum(f.stat().st_size for f in seed.rglob("*") if f.is_file())
                print(f"  {t.name}: first execution storing {n_resume:,} keys took {time.monotonic() - t0:.1f} s "
                      f"({size / 1e6:.0f} MB on disk)", flush=True)

        for rnd in range(rounds):
            order = trees if rnd % 2 == 0 else trees[::-1]
            print(f"round {rnd + 1}/{rounds} ({order[0].name} first)", flush=True)
            jobs: List[tuple] = []
            if "wc" in only:
                jobs.append(("wc", n_keys, n_words))
            if "shapes" in only:
                jobs += [("shape", k, w) for k, w in shapes]
            for job in jobs:
                _, k, w = job
                fig = "wc" if job[0] == "wc" else f"shape{k}"
                for t in order:
                    r = t.child("wordcount", {"keys": k, "words": w, "seed": args.seed, "pairs": 1,
                                              "off_first": rnd % 2 == 0, "tmp": str(tmp)})
                    add(fig, t.name, r)
                    print(f"  {fig:<12} {t.name:<8}: off {r['off'][0]:.2f} s, batch {r['batch'][0]:.2f} s, "
                          f"batch/off {r['off'][0] / r['batch'][0]:.3f} ({r['words']:,} words)", flush=True)
            if "fast" in only:
                for t in order:
                    st = fresh_copy(seeds[t.name], tmp / "trial")
                    r = t.first_line(st, n_resume)
                    add("fast", t.name, r)
                    print(f"  fast resume  {t.name:<8}: first output {r['first_output_s']:.2f} s, process "
                          f"{r['process_s']:.2f} s", flush=True)
            if "hydrate" in only:
                for t in order:
                    st = fresh_copy(seeds[t.name], tmp / "trial")
                    r = t.child("hydrate", {"keys": n_resume, "touch": n_touch, "seed": args.seed + rnd,
                                            "state": str(st)})
                    add("hydrate", t.name, r)
                    print(f"  hydrate      {t.name:<8}: {r['touched']:,} keys in {r['touch_s']:.2f} s after a "
                          f"{'+'.join(r['kinds'])} resume of {r['resume_s']:.2f} s; process {r['since_start_s']:.2f} s; "
                          f"per 1000-key batch p50 {r['batch_gap_p50_s'] * 1e3:.1f} ms, stalls {r['stalls_s']:.2f} s; "
                          f"local writes {r['local_write_s']:.2f} s, back-pressure {r['backpressure_s']:.2f} s, "
                          f"{r['commits']} commits",
                          flush=True)
            if "lookups" in only:
                for t in order:
                    st = fresh_copy(seeds[t.name], tmp / "trial")
                    r = t.child("lookups", {"keys": n_resume, "touch": n_touch, "seed": args.seed + rnd,
                                            "state": str(st), "wait": 3.0})
                    add("lookups", t.name, r)
                    print(f"  lookups      {t.name:<8}: {n_touch:,} store_get at once {r['at_once_s']:.2f} s, "
                          f"after 3 s {r['after_wait_s']:.2f} s", flush=True)
            if "full" in only:
                for t in order:
                    st = fresh_copy(seeds[t.name], tmp / "trial")
                    shutil.rmtree(st / FLOW_ID)
                    r = t.first_line(st, n_resume)
                    add("full", t.name, r)
                    print(f"  full resume  {t.name:<8}: first output {r['first_output_s']:.2f} s, process "
                          f"{r['process_s']:.2f} s", flush=True)
            if "live" in only:
                for t in order:
                    st = fresh_copy(seeds[t.name], tmp / "trial")
                    r = t.child("live", {"keys": n_resume, "state": str(st), "after": 1.5})
                    add("live", t.name, r)
                    fc = r.get("first_commit_after_resume_s")
                    vs = r.get("verify_s")
                    print(f"  first commit {t.name:<8}: "
                          f"{'none' if fc is None else f'{fc:.2f} s'} after the resume "
                          f"({r.get('first_commit_since_start_s', float('nan')):.2f} s after process start; "
                          f"resume {r['resume_s']:.2f} s); check "
                          f"{'-' if vs is None else f'{vs:.2f} s'}", flush=True)
    finally:
        tmp_ctx.cleanup()

    # -- summary ---------------------------------------------------------------
    rows: List[tuple] = []  # (label, base values, cur values, higher_is_better)

    def series(fig: str, tree: str, fn: Any) -> List[float]:
        return [fn(r) for r in data.get(fig, {}).get(tree, [])]

    def row(label: str, fig: str, fn: Any, unit: str, diff: bool = False) -> None:
        b, c = series(fig, "baseline", fn), series(fig, "current", fn)
        if not b or not c:
            return
        per = [(y - x) if diff else (y / x) for x, y in zip(b, c)]
        rows.append((label, b, c, per, unit, diff))

    ratio = lambda r: r["off"][0] / r["batch"][0]  # noqa: E731 - batch/off throughput
    for fig, lbl in [("wc", f"word count {n_keys // 1000}k keys"),
                     *[(f"shape{k}", f"word count {k:,} keys") for k, _ in shapes]]:
        row(f"{lbl}: off (s)", fig, lambda r: r["off"][0], "s")
        row(f"{lbl}: batch (s)", fig, lambda r: r["batch"][0], "s")
        row(f"{lbl}: batch/off throughput", fig, ratio, "x", diff=True)
    row(f"fast resume {n_resume // 1000}k keys, to first output (s)", "fast", lambda r: r["first_output_s"], "s")
    row(f"fast resume {n_resume // 1000}k keys, whole process (s)", "fast", lambda r: r["process_s"], "s")
    row(f"touch {n_touch // 1000}k stored keys after fast resume (s)", "hydrate", lambda r: r["touch_s"], "s")
    row("  that run's fast resume itself (s)", "hydrate", lambda r: r["resume_s"], "s")
    row(f"{n_touch // 1000}k store_get without the flow, at once (s)", "lookups", lambda r: r["at_once_s"], "s")
    row(f"{n_touch // 1000}k store_get without the flow, after 3 s (s)", "lookups", lambda r: r["after_wait_s"], "s")
    row(f"full resume {n_resume // 1000}k keys, to first output (s)", "full", lambda r: r["first_output_s"], "s")
    row("first commit after fast resume, from resume end (s)", "live",
        lambda r: r.get("first_commit_after_resume_s", float("nan")), "s")
    row("first commit after fast resume, from process start (s)", "live",
        lambda r: r.get("first_commit_since_start_s", float("nan")), "s")

    print()
    print(f"{'figure':<58}{'baseline (median)':>18}{'current (median)':>18}{'ratio':>8}  per round")
    for label, b, c, per, unit, diff in rows:
        m = med(per)
        mtxt = f"{m:+.3f}" if diff else f"{m:.2f}x"
        ptxt = ", ".join(f"{x:+.3f}" if diff else f"{x:.2f}" for x in per)
        print(f"{label:<58}{med(b):>18.3f}{med(c):>18.3f}{mtxt:>8}  {ptxt}")
    vs = [r["verify_s"] for r in data.get("live", {}).get("current", []) if r.get("verify_s") is not None]
    if vs:
        print(f"background check of the fast-resumed store (current): median {med(vs):.2f} s "
              f"({', '.join(f'{x:.2f}' for x in vs)})")

    print()
    if "wc" in data:
        d = [x for lbl, *_rest in rows if lbl.startswith(f"word count {n_keys // 1000}k keys: batch/off")
             for x in _rest[2]]
        md = med(d)
        print(f"target 1: word count batch/off ratio drops by at most 0.03: change current - baseline "
              f"{md:+.3f} (median of rounds; per round {', '.join(f'{x:+.3f}' for x in d)}): "
              f"{'met' if md >= -0.03 else 'NOT met'}")
    if "fast" in data:
        d = [c["first_output_s"] / b["first_output_s"] for b, c in zip(data["fast"]["baseline"], data["fast"]["current"])]
        md = med(d)
        print(f"target 2: fast resume of {n_resume:,} keys at most 20% slower: current/baseline {md:.2f}x "
              f"(per round {', '.join(f'{x:.2f}' for x in d)}): {'met' if md <= 1.20 else 'NOT met'}")
    if args.json:
        args.json.write_text(json.dumps({"revs": revs, "rounds": rounds, "quick": args.quick, "data": data},
                                        indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
