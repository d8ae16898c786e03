"""Dataflow throughput with and without recovery, resume time, and Bytewax 0.21.1.

Measured in one run:

1. a stateful word count (``count_final``; 1M words, 100k distinct keys) and
   a stateless ``map`` + ``filter`` flow, through ``millpond.testing.run_main``
   with a ``TestingSource`` (batch size 1000) and a counting sink, in-process:
   items/s with recovery off, recovery on in batch mode (epoch interval 1 s,
   DirBackup under the local state dir) and in immediate mode;
2. time from process start to the first resumed output with 1M keys of
   state: ``python -m millpond.run`` on a per-key counter whose first
   execution stored 1M keys; fast resume (local store present) and full
   resume (local store deleted, rebuilt from the backup);
3. the same flows and resume on Bytewax 0.21.1, installed by this script
   into ``bench/.venv-bytewax`` when missing and run through its CLI as a
   black box (``bench/bytewax_wordcount.py``), recovery off and on (``-r DIR
   -s 1 -b 0``); both sides time from the flow being built to the end.

Each throughput figure is the best of ``--repeat`` rounds, in which the
recovery modes take turns; the batch/off ratio of each round is printed too.
Ratios are what to read: this machine is noisy and shared.

    python bench/wordcount.py                 # full (several minutes, Bytewax included)
    python bench/wordcount.py --quick         # 200k words / 20k keys, 100k resume keys
    python bench/wordcount.py --no-bytewax
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, List, Optional

import millpond.operators as op
from millpond.dataflow import Dataflow
from millpond.outputs import DynamicSink, StatelessSinkPartition
from millpond.recovery import RecoveryConfig, SnapshotMode
from millpond.testing import TestingSource, run_main

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BW_VENV = HERE / ".venv-bytewax"
BW_VERSION = "0.21.1"
BATCH = 1000
INTERVAL = timedelta(seconds=1)


# -- flows --------------------------------------------------------------------


class _CountingPartition(StatelessSinkPartition[Any]):
    def __init__(self, box: List[int]) -> None:
        self.box = box

    def write_batch(self, items: List[Any]) -> None:
        self.box[0] += len(items)


class CountingSink(DynamicSink[Any]):
    """Counts the items it gets."""

    def __init__(self) -> None:
        self.box = [0]

    def build(self, step_id: str, worker_index: int, worker_count: int) -> _CountingPartition:
        return _CountingPartition(self.box)


def _upper(w: str) -> str:
    return w.upper()


def _keep(w: str) -> bool:
    return w[-1] in "02468"


def _key(w: str) -> str:
    return w


def make_flow(kind: str, words: List[str]) -> tuple[Dataflow, CountingSink]:
    flow = Dataflow(f"bench_{kind}")
    s = op.input("inp", flow, TestingSource(words, batch_size=BATCH))
    if kind == "wordcount":
        out = op.count_final("count", s, _key)
    else:
        out = op.filter("keep", op.map("upper", s, _upper), _keep)
    sink = CountingSink()
    op.output("out", out, sink)
    return flow, sink


class _PrintPartition(StatelessSinkPartition[Any]):
    def write_batch(self, items: List[Any]) -> None:
        for k, n in items:
            print(k, n, flush=True)


class PrintSink(DynamicSink[Any]):
    def build(self, step_id: str, worker_index: int, worker_count: int) -> _PrintPartition:
        return _PrintPartition()


def _count(state: Optional[int], _value: Any) -> tuple[int, int]:
    n = (state or 0) + 1
    return n, n


def _resumed(kv: tuple) -> bool:
    return kv[1] >= 2


def resume_flow(n_keys: int) -> Dataflow:
    """A per-key counter over ``n_keys`` keys, then EOF; each later execution
    continues with one repeated key, whose count 2 is the line it prints."""
    keys = [f"key-{i:08d}" for i in range(n_keys)]
    items: List[Any] = list(keys)
    for i in range(4):
        items += [TestingSource.EOF(), keys[i]]
    flow = Dataflow("bench_resume")
    s = op.input("inp", flow, TestingSource(items, batch_size=BATCH))
    counts = op.stateful_map("count", op.key_on("key", s, _key), _count)
    op.output("out", op.filter("resumed", counts, _resumed), PrintSink())
    return flow


# -- millpond side ------------------------------------------------------------


def run_millpond(kind: str, words: List[str], mode: str, tmp: Path) -> dict:
    flow, sink = make_flow(kind, words)
    cfg = None
    state = None
    if mode != "off":
        state = Path(tempfile.mkdtemp(prefix=f"mp-{kind}-{mode}-", dir=tmp))
        cfg = RecoveryConfig(state, snapshot_mode=SnapshotMode(mode))
    t0 = time.perf_counter()
    run_main(flow, epoch_interval=INTERVAL, recovery_config=cfg)
    elapsed = time.perf_counter() - t0
    if state is not None:
        shutil.rmtree(state, ignore_errors=True)
    return {"seconds": elapsed, "items": len(words), "out": sink.box[0], "items_per_s": len(words) / elapsed}


class FirstOutputTimeout(RuntimeError):
    """The process printed nothing within the time limit (it was stopped)."""


def timed_first_line(cmd: List[str], cwd: Path, timeout: float = 600, first_timeout: float = 600) -> dict:
    """Start ``cmd``; time until its first stdout line, then let it finish.

    A process with no output line after ``first_timeout`` seconds is killed
    and :class:`FirstOutputTimeout` raised."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    watchdog = threading.Timer(first_timeout, proc.kill)
    watchdog.start()
    try:
        line = proc.stdout.readline()
        first = time.perf_counter() - t0
        watchdog.cancel()
        if not line and first >= first_timeout:
            raise FirstOutputTimeout(f"no output within {first_timeout:.0f} s (process stopped)")
        rest, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    total = time.perf_counter() - t0
    if proc.returncode != 0 or not line:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}, first line {line!r}: {err[-2000:]}")
    return {"first_output_s": first, "process_s": total, "line": line.strip(), "stderr": err}


def millpond_resume(n_keys: int, tmp: Path) -> dict:
    state = tmp / "mp-resume"
    state.mkdir()
    cmd = [sys.executable, "-m", "millpond.run", f"bench/wordcount.py:resume_flow({n_keys})",
           "-d", str(state), "-s", "1"]
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out = {"keys": n_keys, "first_run_s": time.perf_counter() - t0}
    fast = timed_first_line(cmd, REPO)
    out["fast"] = {k: fast[k] for k in ("first_output_s", "process_s", "line")}
    out["fast"]["log"] = [ln for ln in fast["stderr"].splitlines() if "resume flow" in ln][:1]
    # Full resume: the local store is gone, only the backup (DIR/backup) is left.
    shutil.rmtree(state / "bench_resume")
    full = timed_first_line(cmd, REPO)
    out["full"] = {k: full[k] for k in ("first_output_s", "process_s", "line")}
    out["full"]["log"] = [ln for ln in full["stderr"].splitlines() if "resume flow" in ln][:1]
    # Process start to exit of an empty Python + millpond import, for scale.
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import millpond.run, millpond.recovery"], check=True)
    out["import_s"] = time.perf_counter() - t0
    shutil.rmtree(state, ignore_errors=True)
    return out


# -- Bytewax side -------------------------------------------------------------


def ensure_bytewax() -> tuple[Optional[Path], str]:
    """Return (python of the Bytewax venv, "") or (None, why it is unavailable):
    ``bench/cluster_scaling.py``'s set-up, on this script's venv."""
    # Run as a script, this directory is on sys.path.
    import cluster_scaling as scaling

    assert scaling.BW_VERSION == BW_VERSION, (scaling.BW_VERSION, BW_VERSION)
    return scaling.ensure_bytewax(BW_VENV)  # type: ignore[no-any-return]


def run_bytewax(py: Path, kind: str, words_path: Path, recovery: bool, tmp: Path) -> dict:
    cmd = [str(py), "-m", "bytewax.run", f"bytewax_wordcount:get_flow({str(words_path)!r}, {kind!r})", "-s", "1"]
    rdir = None
    if recovery:
        rdir = Path(tempfile.mkdtemp(prefix=f"bw-{kind}-", dir=tmp))
        subprocess.run([str(py), "-m", "bytewax.recovery", str(rdir), "1"], check=True, capture_output=True)
        cmd += ["-r", str(rdir), "-b", "0"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=1800)
    wall = time.perf_counter() - t0
    if rdir is not None:
        shutil.rmtree(rdir, ignore_errors=True)
    line = next((ln for ln in r.stdout.splitlines() if ln.startswith("BENCH ")), None)
    if r.returncode != 0 or line is None:
        raise RuntimeError(f"bytewax {kind} exited {r.returncode}: {r.stderr.strip()[-1500:]}")
    f = dict(kv.split("=") for kv in line.split()[1:])
    secs = float(f["seconds"])
    return {"seconds": secs, "items": int(f["items"]), "out": int(f["out"]),
            "items_per_s": int(f["items"]) / secs, "process_s": wall}


def bytewax_resume(py: Path, n_keys: int, tmp: Path, first_timeout: float) -> dict:
    rdir = tmp / "bw-resume"
    rdir.mkdir()
    subprocess.run([str(py), "-m", "bytewax.recovery", str(rdir), "1"], check=True, capture_output=True)
    cmd = [str(py), "-m", "bytewax.run", f"bytewax_wordcount:resume_flow({n_keys})", "-r", str(rdir), "-s", "1",
           "-b", "0"]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"bytewax resume first run exited {r.returncode}: {r.stderr.strip()[-1500:]}")
    out = {"keys": n_keys, "first_run_s": time.perf_counter() - t0}
    try:
        res = timed_first_line(cmd, HERE, timeout=1800, first_timeout=first_timeout)
        out["resume"] = {k: res[k] for k in ("first_output_s", "process_s", "line")}
    except FirstOutputTimeout:
        out["resume"] = {"first_output_s": float("inf"), "timed_out_after_s": first_timeout}
    t0 = time.perf_counter()
    subprocess.run([str(py), "-c", "import bytewax.run, bytewax.recovery"], check=True)
    out["import_s"] = time.perf_counter() - t0
    shutil.rmtree(rdir, ignore_errors=True)
    return out


# -- main ---------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="200k words, 20k keys, 100k resume keys, 1 repeat")
    ap.add_argument("--words", type=int, help="input words (default 1,000,000)")
    ap.add_argument("--keys", type=int, help="distinct words (default 100,000)")
    ap.add_argument("--resume-keys", type=int, help="keys of state for the resume figure (default 1,000,000)")
    ap.add_argument("--repeat", type=int, help="rounds of millpond throughput runs, best kept (default 3)")
    ap.add_argument("--no-bytewax", action="store_true", help="skip the Bytewax comparison")
    ap.add_argument("--no-resume", action="store_true", help="skip the resume figures")
    ap.add_argument("--resume-timeout", type=float, default=300,
                    help="stop a Bytewax resume with no output after this many seconds (default 300)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    n_words = args.words or (200_000 if args.quick else 1_000_000)
    n_keys = args.keys or (20_000 if args.quick else 100_000)
    n_resume = args.resume_keys or (100_000 if args.quick else 1_000_000)
    repeat = args.repeat or (1 if args.quick else 3)

    rnd = random.Random(args.seed)
    words = [f"w{rnd.randrange(n_keys):06d}" for _ in range(n_words)]
    print(f"wordcount: {n_words:,} words, {len(set(words)):,} distinct; batch size {BATCH}; epoch interval 1 s; "
          f"resume with {n_resume:,} keys; best of {repeat} rounds")
    res: dict[str, Any] = {"words": n_words, "distinct": len(set(words)), "millpond": {}, "bytewax": {}}
    kinds = ("wordcount", "stateless")
    modes = ("off", "batch", "immediate")
    with tempfile.TemporaryDirectory(prefix="mp-bench-wc-") as tmp_s:
        tmp = Path(tmp_s)
        for kind in kinds:
            # Modes take turns within each round, so a machine that slows
            # down for a while weighs on every mode alike, and each round
            # gives a paired ratio.
            runs: dict[str, list] = {mode: [] for mode in modes}
            for _ in range(repeat):
                for mode in modes:
                    runs[mode].append(run_millpond(kind, words, mode, tmp))
            for mode in modes:
                best = min(runs[mode], key=lambda r: r["seconds"])
                res["millpond"][f"{kind}/{mode}"] = best
                times = ", ".join(f"{r['seconds']:.2f}" for r in runs[mode])
                print(f"  millpond {kind:<9} recovery {mode:<9}: {best['items_per_s']:>10,.0f} items/s "
                      f"({best['seconds']:.2f} s best of {times}; {best['out']:,} out)", flush=True)
            paired = sorted(o["seconds"] / b["seconds"] for o, b in zip(runs["off"], runs["batch"]))
            res["millpond"][f"{kind}/paired_batch_ratios"] = paired
            print(f"  millpond {kind:<9} batch/off per round: {', '.join(f'{x:.2f}' for x in paired)}", flush=True)
        if not args.no_resume:
            res["millpond_resume"] = millpond_resume(n_resume, tmp)
            mr = res["millpond_resume"]
            print(f"  millpond resume {n_resume:,} keys: first output after {mr['fast']['first_output_s']:.2f} s "
                  f"(fast), {mr['full']['first_output_s']:.2f} s (full); first run took {mr['first_run_s']:.1f} s",
                  flush=True)
        bw_error = ""
        if not args.no_bytewax:
            py, bw_error = ensure_bytewax()
            if py is None:
                print(f"  Bytewax unavailable: {bw_error}")
            else:
                words_path = tmp / "words.txt"
                words_path.write_text("\n".join(words) + "\n")
                try:
                    for kind in kinds:
                        for rec in (False, True):
                            r = run_bytewax(py, kind, words_path, rec, tmp)
                            res["bytewax"][f"{kind}/{'on' if rec else 'off'}"] = r
                            print(f"  bytewax  {kind:<9} recovery {'on' if rec else 'off':<9}: "
                                  f"{r['items_per_s']:>10,.0f} items/s ({r['seconds']:.2f} s, {r['out']:,} out)",
                                  flush=True)
                    if not args.no_resume:
                        res["bytewax_resume"] = bytewax_resume(py, n_resume, tmp, args.resume_timeout)
                        br = res["bytewax_resume"]
                        print(f"  bytewax resume {n_resume:,} keys: first output after "
                              f"{br['resume']['first_output_s']:.2f} s; first run took {br['first_run_s']:.1f} s",
                              flush=True)  # inf: stopped after --resume-timeout
                except (RuntimeError, subprocess.SubprocessError, OSError) as exc:
                    bw_error = f"Bytewax run failed: {exc}"
                    print(f"  {bw_error}")
        res["bytewax_error"] = bw_error

    mp, bw = res["millpond"], res["bytewax"]
    print()
    print(f"{'items/s':<28}{'recovery off':>14}{'batch':>14}{'immediate':>14}{'batch/off':>11}{'immed/off':>11}")
    for kind in kinds:
        off, b, i = (mp[f"{kind}/{m}"]["items_per_s"] for m in modes)
        print(f"{'millpond ' + kind:<28}{off:>14,.0f}{b:>14,.0f}{i:>14,.0f}{b / off:>11.2f}{i / off:>11.2f}")
    for kind in kinds:
        if f"{kind}/off" in bw:
            off, on = bw[f"{kind}/off"]["items_per_s"], bw[f"{kind}/on"]["items_per_s"]
            print(f"{'bytewax ' + kind:<28}{off:>14,.0f}{on:>14,.0f}{'-':>14}{on / off:>11.2f}{'-':>11}")
    print()
    for kind in kinds:
        ratio = mp[f"{kind}/batch"]["items_per_s"] / mp[f"{kind}/off"]["items_per_s"]
        paired = mp[f"{kind}/paired_batch_ratios"]
        print(f"millpond {kind:<9} batch mode vs recovery off: {ratio:6.2f}x best of each, "
              f"{statistics.median(paired):.2f}x median of rounds  (target >= 0.85x: "
              f"{'met' if ratio >= 0.85 else 'NOT met'})")
    for kind in kinds:
        if f"{kind}/off" in bw:
            r_off = mp[f"{kind}/off"]["items_per_s"] / bw[f"{kind}/off"]["items_per_s"]
            r_on = mp[f"{kind}/batch"]["items_per_s"] / bw[f"{kind}/on"]["items_per_s"]
            print(f"millpond/bytewax {kind:<9} recovery off: {r_off:6.2f}x (target >= 1: {'met' if r_off >= 1 else 'NOT met'}); "
                  f"recovery on (batch): {r_on:6.2f}x (target > 1: {'met' if r_on > 1 else 'NOT met'})")
    if "millpond_resume" in res:
        mr = res["millpond_resume"]
        print(f"resume with {mr['keys']:,} keys, process start to first resumed output: millpond fast "
              f"{mr['fast']['first_output_s']:.2f} s, full {mr['full']['first_output_s']:.2f} s "
              f"(python + import alone {mr['import_s']:.2f} s)")
        if mr["fast"]["log"]:
            print(f"  millpond log: {mr['fast']['log'][0]}")
        if "bytewax_resume" in res:
            br = res["bytewax_resume"]
            if "timed_out_after_s" in br["resume"]:
                lim = br["resume"]["timed_out_after_s"]
                print(f"  bytewax: no resumed output within {lim:.0f} s, stopped (python + import alone "
                      f"{br['import_s']:.2f} s); millpond fast resume is more than "
                      f"{lim / mr['fast']['first_output_s']:.0f}x faster")
            else:
                ratio = br["resume"]["first_output_s"] / mr["fast"]["first_output_s"]
                print(f"  bytewax {br['resume']['first_output_s']:.2f} s (python + import alone {br['import_s']:.2f} s); "
                      f"millpond fast resume is {ratio:.2f}x faster (target > 1: {'met' if ratio > 1 else 'NOT met'})")
    if res["bytewax_error"]:
        print(f"Bytewax comparison incomplete: {res['bytewax_error']}")
    if args.json:
        args.json.write_text(json.dumps(res, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
