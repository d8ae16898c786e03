"""Per-epoch commit latency and upload throughput of the durable pipeline.

Drives ``millpond.recovery`` directly (no dataflow engine): one worker, a
state step, N keys changed per epoch, ``close_epoch`` every simulated 1 s
epoch (the remainder of the interval is slept), then ``finish``. Measured in
one process and one run:

1. for DirBackup and for the S3 test server (``mp-s3server``, built from
   this repository and started on 127.0.0.1), at 10k and 1M changed keys per
   epoch: commit latency per epoch (epoch close -> committed, from
   ``RecoveryRun.metrics()``), the time ``close_epoch`` itself takes (the
   snapshot of the touched keys), and upload throughput (bytes uploaded /
   time spent uploading);
2. the baseline for DirBackup throughput: ``cp`` of a file set with the
   same number of files and bytes as the segments, in the same run (also
   ``cp`` followed by ``sync`` of the copies, since DirBackup fsyncs);
3. immediate vs batch snapshot mode (DirBackup, 10k keys per epoch in 10
   activations of 1k keys): segments written, bytes uploaded, and latency
   from a state change to its segment being uploaded and to its epoch being
   committed (what a resume can use).

Ratios are what to read: this machine is noisy and shared.

    python bench/commit_latency.py                 # full (a few minutes)
    python bench/commit_latency.py --quick         # 10k keys only, fewer epochs
    python bench/commit_latency.py --backends dir --keys 10000 --epochs 20
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# The S3 test server takes any credentials, but the Go core needs some. It
# reads the process's original environment (changes made with os.environ
# here are not seen), so without them the script runs itself again with test
# values set.
_TEST_AWS = {"AWS_ACCESS_KEY_ID": "millpond-bench", "AWS_SECRET_ACCESS_KEY": "millpond-bench-secret",
             "AWS_REGION": "us-east-1"}
if __name__ == "__main__" and not (os.environ.get("AWS_ACCESS_KEY_ID") and os.environ.get("AWS_SECRET_ACCESS_KEY")):
    sys.exit(subprocess.run([sys.executable, *sys.argv], env={**os.environ, **_TEST_AWS}).returncode)

from millpond.engine.recovery_run import open_recovery_run  # noqa: E402
from millpond.recovery import RecoveryConfig, SnapshotMode  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
# The same ~100-byte state as the snapshot benchmark (run as a script, this
# directory is on sys.path).
from snapshot_write import FLOW, LABEL, STEP, Account  # noqa: E402


def pct(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); with fewer than 100 samples p99 is the max."""
    if not values:
        return float("nan")
    s = sorted(values)
    rank = max(1, -(-len(s) * q // 100))  # ceil
    return s[int(rank) - 1]


# -- S3 test server -------------------------------------------------------------


class S3Server:
    """``mp-s3server`` built into a temp dir, on 127.0.0.1, stopped on exit."""

    def __init__(self, workdir: Path, bucket: str = "bench") -> None:
        self.binary = workdir / "mp-s3server"
        self.bucket = bucket
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> "S3Server":
        subprocess.run(["go", "build", "-o", str(self.binary), "./gostore/cmd/mp-s3server"],
                       cwd=REPO, check=True)
        self.proc = subprocess.Popen([str(self.binary), "-bucket", self.bucket, "-addr", "127.0.0.1:0"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("listening on http://127.0.0.1:"):
            self.__exit__()
            raise RuntimeError(f"mp-s3server did not start: {line!r}")
        self.url = line.split("listening on ", 1)[1]
        return self

    def uri(self, prefix: str) -> str:
        return f"s3://{self.bucket}/{prefix}?endpoint={self.url}&region=us-east-1"

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


# -- one recovery run ---------------------------------------------------------


def run_epochs(root: Path, backup: str | None, keys: list[str], epochs: int, interval: float) -> dict:
    """Change every key in ``keys`` in each of ``epochs`` epochs; return the figures."""
    local = root / "local"
    local.mkdir()
    cfg = RecoveryConfig(local, backup=backup, snapshot_mode=SnapshotMode.BATCH)
    run = open_recovery_run(cfg, FLOW, 1)
    close_s: list[float] = []
    work_s: list[float] = []
    overrun = 0
    try:
        store = run.worker_store(0)
        store.register(STEP, Account)
        gob = store.get_or_build
        t_start = time.perf_counter()
        for e in range(1, epochs + 1):
            t0 = time.perf_counter()
            for k in keys:
                gob(STEP, k).state = (e, LABEL)
            t1 = time.perf_counter()
            run.close_epoch(0, e)
            t2 = time.perf_counter()
            work_s.append(t1 - t0)
            close_s.append(t2 - t1)
            rest = interval - (t2 - t0)
            if rest > 0:
                time.sleep(rest)
            else:
                overrun += 1
        t_fin = time.perf_counter()
        run.finish(False)
        finish_s = time.perf_counter() - t_fin
        total_s = time.perf_counter() - t_start
        m = run.metrics()
    finally:
        run.close()
    lat = [float(x) for x in (m.get("commit_latencies") or [])]
    return {
        "keys": len(keys), "epochs": epochs, "committed_epoch": m["committed_epoch"],
        "commit_latencies": lat,
        "commit_p50": pct(lat, 50), "commit_p99": pct(lat, 99), "commit_max": max(lat) if lat else float("nan"),
        "close_epoch_p50": pct(close_s, 50), "close_epoch_max": max(close_s),
        "touch_p50": pct(work_s, 50),
        "epochs_over_interval": overrun,
        "finish_s": finish_s, "total_s": total_s,
        "bytes_uploaded": m["bytes_uploaded"], "segments_uploaded": m["segments_uploaded"],
        "upload_seconds": m["upload_seconds"], "backpressure_seconds": m["backpressure_seconds"],
        "compactions": m["compactions"],
        "upload_MBps": m["bytes_uploaded"] / m["upload_seconds"] / 1e6 if m["upload_seconds"] else float("nan"),
    }


def cp_baseline(root: Path, files: int, total_bytes: int) -> dict:
    """Time ``cp`` of ``files`` files of ``total_bytes`` bytes in all, same filesystem as the backup."""
    src, dst, dst2 = root / "cp-src", root / "cp-dst", root / "cp-dst-sync"
    for d in (src, dst, dst2):
        d.mkdir()
    files = max(1, files)
    size = max(1, total_bytes // files)
    block = os.urandom(min(size, 1 << 20))
    names = []
    for i in range(files):
        p = src / f"seg-{i:05d}.sqlite"
        with open(p, "wb") as f:
            left = size
            while left > 0:
                f.write(block[:left])
                left -= len(block[:left])
        names.append(str(p))
    subprocess.run(["sync"], check=True)  # sources on disk, so only the copy is timed
    t0 = time.perf_counter()
    subprocess.run(["cp", *names, str(dst)], check=True)
    cp_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    subprocess.run(["cp", *names, str(dst2)], check=True)
    subprocess.run(["sync", *[str(dst2 / Path(n).name) for n in names]], check=True)
    cp_sync_s = time.perf_counter() - t0
    nbytes = size * files
    return {"files": files, "bytes": nbytes, "cp_s": cp_s, "cp_sync_s": cp_sync_s,
            "cp_MBps": nbytes / cp_s / 1e6, "cp_sync_MBps": nbytes / cp_sync_s / 1e6}


# -- immediate vs batch -------------------------------------------------------


class Poller(threading.Thread):
    """Records (time, segments_uploaded, committed_epoch) whenever they change."""

    def __init__(self, run, period: float = 0.002) -> None:
        super().__init__(daemon=True, name="bench-poller")
        self.run_ = run
        self.period = period
        self.events: list[tuple[float, int, int]] = []
        self.stop = threading.Event()

    def run(self) -> None:  # noqa: D102 - thread body
        last = None
        while not self.stop.is_set():
            m = self.run_.metrics()
            cur = (m["segments_uploaded"], m["committed_epoch"])
            if cur != last:
                self.events.append((time.perf_counter(), *cur))
                last = cur
            time.sleep(self.period)

    def first(self, segments: int = 0, committed: int = 0) -> float:
        for t, s, c in self.events:
            if s >= segments and c >= committed:
                return t
        return float("nan")


def durability(root: Path, mode: SnapshotMode, keys: list[str], epochs: int, activations: int,
               interval: float) -> dict:
    """``activations`` evenly spaced changes of len(keys)/activations keys per epoch."""
    local = root / "local"
    local.mkdir()
    run = open_recovery_run(RecoveryConfig(local, snapshot_mode=mode), FLOW, 1)
    changes: list[tuple[float, int, int]] = []  # (time, epoch, segment number if immediate)
    poller = Poller(run)
    per = len(keys) // activations
    try:
        store = run.worker_store(0)
        store.register(STEP, Account)
        gob = store.get_or_build
        poller.start()
        seg = 0
        for e in range(1, epochs + 1):
            t_epoch = time.perf_counter()
            for a in range(activations):
                target = t_epoch + a * interval / activations
                now = time.perf_counter()
                if target > now:
                    time.sleep(target - now)
                for k in keys[a * per:(a + 1) * per]:
                    gob(STEP, k).state = (e, LABEL)
                t_change = time.perf_counter()
                run.activation_done(0, e)
                seg += 1
                changes.append((t_change, e, seg))
            rest = t_epoch + interval - time.perf_counter()
            if rest > 0:
                time.sleep(rest)
            run.close_epoch(0, e)
            if mode is SnapshotMode.BATCH:
                seg = e
        run.finish(False)
        time.sleep(0.02)
        poller.stop.set()
        poller.join()
        m = run.metrics()
    finally:
        poller.stop.set()
        run.close()
    to_upload, to_commit = [], []
    for t, e, s in changes:
        to_commit.append(poller.first(committed=e) - t)
        # batch: the epoch's one segment; immediate: this activation's segment
        to_upload.append(poller.first(segments=(e if mode is SnapshotMode.BATCH else s)) - t)
    return {
        "mode": mode.value, "epochs": epochs, "activations_per_epoch": activations, "keys_per_epoch": per * activations,
        "segments": m["segments_uploaded"], "bytes_uploaded": m["bytes_uploaded"], "compactions": m["compactions"],
        "objects_deleted": m["objects_deleted"],
        "to_uploaded_mean": statistics.fmean(to_upload), "to_uploaded_max": max(to_upload),
        "to_committed_mean": statistics.fmean(to_commit), "to_committed_max": max(to_commit),
        "commit_p50": pct([float(x) for x in m["commit_latencies"] or []], 50),
    }


# -- main ---------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="10k keys only, 8 epochs, 3 for the mode comparison")
    ap.add_argument("--keys", type=int, nargs="+", help="changed keys per epoch (default 10000 1000000)")
    ap.add_argument("--epochs", type=int, help="epochs per run at 10k keys (default 20)")
    ap.add_argument("--big-epochs", type=int, default=3, help="epochs per run at >= 100k keys (default 3)")
    ap.add_argument("--backends", nargs="+", default=["dir", "s3"], choices=["dir", "s3"])
    ap.add_argument("--interval", type=float, default=1.0, help="simulated epoch interval, seconds")
    ap.add_argument("--no-modes", action="store_true", help="skip immediate vs batch")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args(argv)
    sizes = args.keys or ([10_000] if args.quick else [10_000, 1_000_000])
    small_epochs = args.epochs or (8 if args.quick else 20)
    mode_epochs = 3 if args.quick else 6

    print(f"commit_latency: backends {', '.join(args.backends)}; changed keys per epoch "
          f"{', '.join(f'{n:,}' for n in sizes)}; epoch interval {args.interval:g} s; "
          f"~100-byte pickled state per key")
    results: dict = {"runs": [], "cp": [], "modes": []}
    with tempfile.TemporaryDirectory(prefix="mp-bench-cl-") as tmp_s:
        tmp = Path(tmp_s)
        server = S3Server(tmp) if "s3" in args.backends else None
        try:
            if server is not None:
                server.__enter__()
                print(f"S3 test server: {server.url} (mp-s3server, in memory)")
            for n in sizes:
                keys = [f"user-{i:08d}" for i in range(n)]
                epochs = small_epochs if n < 100_000 else args.big_epochs
                for backend in args.backends:
                    root = tmp / f"{backend}-{n}"
                    root.mkdir()
                    if backend == "dir":
                        (root / "backup").mkdir()
                        uri = str(root / "backup")
                    else:
                        uri = server.uri(f"run-{n}")
                    r = run_epochs(root, uri, keys, epochs, args.interval)
                    r["backend"] = backend
                    results["runs"].append(r)
                    print(f"  {backend:<3} {n:>9,} keys x {epochs:>2} epochs: commit p50 {r['commit_p50']:.3f} s "
                          f"p99 {r['commit_p99']:.3f} s max {r['commit_max']:.3f} s; close_epoch p50 "
                          f"{r['close_epoch_p50']:.3f} s; upload {r['upload_MBps']:.1f} MB/s "
                          f"({r['bytes_uploaded'] / 1e6:.1f} MB in {r['segments_uploaded']} segments)", flush=True)
                    if backend == "dir":
                        c = cp_baseline(root, r["segments_uploaded"], r["bytes_uploaded"])
                        c["keys"] = n
                        results["cp"].append(c)
                        print(f"      cp of {c['files']} files, {c['bytes'] / 1e6:.1f} MB: {c['cp_MBps']:.1f} MB/s; "
                              f"cp + sync: {c['cp_sync_MBps']:.1f} MB/s", flush=True)
                    shutil.rmtree(root, ignore_errors=True)
        finally:
            if server is not None:
                server.__exit__()
        if not args.no_modes:
            keys = [f"user-{i:08d}" for i in range(10_000)]
            for mode in (SnapshotMode.BATCH, SnapshotMode.IMMEDIATE):
                root = tmp / f"mode-{mode.value}"
                root.mkdir()
                results["modes"].append(durability(root, mode, keys, mode_epochs, 10, args.interval))
                shutil.rmtree(root, ignore_errors=True)

    print()
    print(f"{'backend':<8}{'keys/epoch':>11}{'epochs':>7}{'commit p50':>11}{'p99':>8}{'max':>8}"
          f"{'close_epoch':>12}{'upload MB/s':>12}{'MB':>8}{'segs':>6}{'waits s':>8}")
    for r in results["runs"]:
        print(f"{r['backend']:<8}{r['keys']:>11,}{r['epochs']:>7}{r['commit_p50']:>11.3f}{r['commit_p99']:>8.3f}"
              f"{r['commit_max']:>8.3f}{r['close_epoch_p50']:>12.3f}{r['upload_MBps']:>12.1f}"
              f"{r['bytes_uploaded'] / 1e6:>8.1f}{r['segments_uploaded']:>6}{r['backpressure_seconds']:>8.3f}")
    print("(commit = epoch close -> committed, from RecoveryRun.metrics(); close_epoch = the snapshot call itself;"
          " p99 of fewer than 100 epochs is the max)")
    print()
    verdicts = []
    for c in results["cp"]:
        r = next(x for x in results["runs"] if x["backend"] == "dir" and x["keys"] == c["keys"])
        ratio = r["upload_MBps"] / c["cp_MBps"]
        ratio_sync = r["upload_MBps"] / c["cp_sync_MBps"]
        ok = ratio >= 0.5
        verdicts.append(ok)
        print(f"DirBackup upload vs cp, {c['keys']:,} keys/epoch:        {ratio:6.2f}x   (target >= 0.5x: "
              f"{'met' if ok else 'NOT met'}); vs cp + sync: {ratio_sync:.2f}x")
    for r in results["runs"]:
        if r["backend"] == "dir" and r["keys"] == 10_000:
            ok = r["commit_p99"] < 0.25 * args.interval
            verdicts.append(ok)
            print(f"DirBackup p99 commit latency, 10k keys/epoch: {r['commit_p99']:6.3f} s (target < "
                  f"{0.25 * args.interval:.2f} s: {'met' if ok else 'NOT met'})")
    s3 = {r["keys"]: r for r in results["runs"] if r["backend"] == "s3"}
    dr = {r["keys"]: r for r in results["runs"] if r["backend"] == "dir"}
    for n in sorted(set(s3) & set(dr)):
        print(f"S3 test server vs DirBackup, {n:,} keys/epoch: upload {s3[n]['upload_MBps'] / dr[n]['upload_MBps']:.2f}x, "
              f"commit p50 {s3[n]['commit_p50'] / dr[n]['commit_p50']:.2f}x the latency")
    if results["modes"]:
        print()
        print(f"immediate vs batch (DirBackup, 10k keys/epoch in 10 activations, {mode_epochs} epochs of "
              f"{args.interval:g} s):")
        print(f"{'mode':<11}{'segments':>9}{'MB uploaded':>12}{'change->uploaded mean/max (s)':>31}"
              f"{'change->committed mean/max (s)':>32}")
        for d in results["modes"]:
            print(f"{d['mode']:<11}{d['segments']:>9}{d['bytes_uploaded'] / 1e6:>12.2f}"
                  f"{d['to_uploaded_mean']:>20.3f} / {d['to_uploaded_max']:<8.3f}"
                  f"{d['to_committed_mean']:>21.3f} / {d['to_committed_max']:<8.3f}")
        b, i = results["modes"]
        print(f"immediate/batch: {i['segments'] / b['segments']:.1f}x the segments, "
              f"{i['bytes_uploaded'] / b['bytes_uploaded']:.2f}x the bytes, change->uploaded "
              f"{i['to_uploaded_mean'] / b['to_uploaded_mean']:.2f}x, change->committed "
              f"{i['to_committed_mean'] / b['to_committed_mean']:.2f}x")
        print("(a change is resumable once its epoch is committed; immediate mode makes it durable in the"
              " backup sooner, committing still waits for the epoch close)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
