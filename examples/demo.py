"""``make demo``: a word count that is killed with SIGKILL and resumes exactly.

What it does, with no arguments:

1. Generates a text file in a temporary directory (1,200,000 words drawn
   from 20,000 distinct ones, fixed seed, so every run counts the same text).
2. Counts it twice for reference: with plain Python (``collections.Counter``)
   and with an uninterrupted ``python -m millpond.run`` of the flow in
   ``examples/wordcount.py`` without recovery. The two must agree.
3. Runs the same flow with recovery on::

       python -m millpond.run 'examples/wordcount.py:get_flow("in.txt", "counts.tsv")' \\
           -d STATE -b BACKUP -s 0.2

   waits until it has committed at least one epoch, waits a random extra
   moment, and kills it with SIGKILL.
4. Runs the same command again; it resumes from the newest committed epoch
   (the ``resume flow ...`` line it logs says which one, and how long
   restoring took) and finishes.
5. Prints the top-10 counts and compares the resumed run's ``counts.tsv``
   with the uninterrupted run's. Exit status 0 when they are equal, 1 when
   they are not (or anything else went wrong).

Options (all optional): ``--words N``, ``--distinct N``, ``--seed N`` (the
text), ``--kill-seed N`` (the random kill point), ``--epoch-interval S``,
``--keep DIR`` (work in DIR and keep it, to look at the state and backup
afterwards), ``-v`` (diagnostic logging on stderr).

Only subprocesses are used (no fork); every process started here is stopped
before the demo exits and the temporary directory is removed.
"""

from __future__ import annotations

import argparse
import collections
import logging
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

log = logging.getLogger("millpond.demo")

HERE = Path(__file__).resolve().parent
FLOW_FILE = HERE / "wordcount.py"
FLOW_ID = "wordcount"

RESUME_RE = re.compile(
    r"resume flow '(?P<flow>[^']*)': (?P<kind>\S+) resume, execution (?P<execution>\d+), "
    r"resume epoch (?P<epoch>\d+), (?P<count>\d+) (?P<what>keys|stored rows) restored.*? on (?P<workers>\d+) worker\(s\) "
    r"in (?P<seconds>[\d.]+) s"
)


# ---------------------------------------------------------------------------
# Input


def make_vocabulary(distinct: int, rng: random.Random) -> List[str]:
    """``distinct`` different lower-case words of 3 to 10 letters."""
    seen: Dict[str, None] = {}
    while len(seen) < distinct:
        n = rng.randint(3, 10)
        seen["".join(rng.choice(string.ascii_lowercase) for _ in range(n))] = None
    return list(seen)


def write_text(path: Path, words: int, distinct: int, seed: int) -> collections.Counter:
    """Write ``words`` words, 12 to a line, and return their counts.

    Word frequencies follow a Zipf-like curve, so the top of the count table
    is interesting to look at.
    """
    rng = random.Random(seed)
    vocab = make_vocabulary(distinct, rng)
    weights = [1.0 / (rank + 1) for rank in range(distinct)]
    drawn = rng.choices(vocab, weights=weights, k=words)
    # Every word appears at least once: the first `distinct` draws are the
    # vocabulary itself, shuffled.
    first = vocab[:]
    rng.shuffle(first)
    drawn[: min(distinct, words)] = first[: min(distinct, words)]
    with open(path, "w", encoding="utf-8") as f:
        for i in range(0, len(drawn), 12):
            f.write(" ".join(drawn[i : i + 12]))
            f.write("\n")
    return collections.Counter(drawn)


def read_counts(path: Path) -> Dict[str, int]:
    """Parse a ``word<TAB>count`` file written by the flow."""
    counts: Dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            word, _, n = line.rstrip("\n").partition("\t")
            if word in counts:
                raise ValueError(f"{path}: {word!r} appears twice")
            counts[word] = int(n)
    return counts


# ---------------------------------------------------------------------------
# Processes


class Flow:
    """One ``python -m millpond.run`` child; stderr is collected in a thread."""

    def __init__(self, workdir: Path, out_name: str, extra: List[str]) -> None:
        import_str = f"{FLOW_FILE}:get_flow({'in.txt'!r}, {out_name!r})"
        self.argv = [sys.executable, "-m", "millpond.run", import_str, *extra]
        log.info("starting: %s (in %s)", " ".join(self.argv[1:]), workdir)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(
            self.argv,
            cwd=workdir,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.stderr: List[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            line = line.rstrip("\n")
            self.stderr.append(line)
            log.debug("[pid %d] %s", self.proc.pid, line)

    def wait(self, timeout: float) -> int:
        rc = self.proc.wait(timeout=timeout)
        self._reader.join(5)
        return rc

    def stop(self) -> None:
        """Kill the child if it is still running (cleanup on any exit path)."""
        if self.proc.poll() is None:
            log.info("stopping pid %d", self.proc.pid)
            self.proc.kill()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                log.warning("pid %d did not exit after SIGKILL", self.proc.pid)
        self._reader.join(5)

    def failure(self, rc: int) -> str:
        tail = "\n".join("    " + line for line in self.stderr[-15:])
        return f"`{' '.join(self.argv[1:])}` exited with status {rc}:\n{tail}"


class DemoError(Exception):
    pass


def committed_epochs(backup_dir: Path) -> List[int]:
    """Epochs with a commit record in the backup (read through the Backup API)."""
    from millpond.backup import backup_from_uri

    if not (backup_dir / FLOW_ID).exists():
        return []
    backup = backup_from_uri(str(backup_dir))
    try:
        keys = backup.list_keys(f"{FLOW_ID}/commits/")
    finally:
        close = getattr(backup, "close", None)
        if close is not None:
            close()
    epochs = []
    for key in keys:
        stem = key.rsplit("/", 1)[-1].split(".", 1)[0]
        if stem.isdigit():
            epochs.append(int(stem))
    return sorted(epochs)


def inspect_backup(backup_dir: Path) -> str:
    out = subprocess.run(
        [sys.executable, "-m", "millpond.recovery", "inspect", str(backup_dir), "--flow", FLOW_ID],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if out.returncode != 0:
        raise DemoError(f"millpond.recovery inspect failed ({out.returncode}): {out.stderr.strip()}")
    return out.stdout.rstrip("\n")


# ---------------------------------------------------------------------------
# The demo


def run_to_completion(flow: Flow, timeout: float = 120) -> float:
    try:
        rc = flow.wait(timeout)
    except subprocess.TimeoutExpired:
        raise DemoError(f"`{' '.join(flow.argv[1:])}` did not finish in {timeout:.0f} s") from None
    if rc != 0:
        raise DemoError(flow.failure(rc))
    return time.monotonic() - flow.started


def interrupted_run(
    workdir: Path, state: Path, backup: Path, extra: List[str], rng: random.Random, max_delay: float
) -> Tuple[float, List[int]]:
    """Start the recovering run, kill it mid-run; return (seconds, commits at kill).

    Tries again from scratch, with a shorter delay, in the unlikely case that
    the run finished before the kill.
    """
    flows: List[Flow] = []
    try:
        for attempt in range(4):
            for d in (state, backup):
                shutil.rmtree(d, ignore_errors=True)
            state.mkdir()
            flow = Flow(workdir, "counts.tsv", ["-d", str(state), "-b", str(backup), *extra])
            flows.append(flow)
            # Wait for the first commit record: from then on a kill leaves
            # something to resume from.
            deadline = time.monotonic() + 60
            while not committed_epochs(backup):
                if flow.proc.poll() is not None:
                    raise DemoError(flow.failure(flow.proc.returncode))
                if time.monotonic() > deadline:
                    raise DemoError("no epoch was committed within 60 s")
                time.sleep(0.02)
            delay = rng.uniform(0, max_delay)
            log.info("first commit after %.2f s; killing %.2f s later", time.monotonic() - flow.started, delay)
            time.sleep(delay)
            if flow.proc.poll() is not None:
                log.info("the run finished before the kill; trying again with a shorter delay")
                max_delay /= 2
                continue
            flow.proc.send_signal(signal.SIGKILL)
            killed_at = time.monotonic() - flow.started
            flow.wait(30)
            return killed_at, committed_epochs(backup)
        raise DemoError("the run kept finishing before it could be killed; use more --words")
    finally:
        for f in flows:
            f.stop()


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description="millpond demo: kill a word count with SIGKILL, resume it, check it.")
    p.add_argument("--words", type=int, default=1_200_000, help="words in the generated text (default 1200000)")
    p.add_argument("--distinct", type=int, default=20_000, help="distinct words (default 20000)")
    p.add_argument("--seed", type=int, default=2024, help="seed of the generated text (default 2024)")
    p.add_argument("--kill-seed", type=int, default=None, help="seed of the random kill point (default: random)")
    p.add_argument("--epoch-interval", type=float, default=0.2, help="seconds per epoch (default 0.2)")
    p.add_argument("--keep", type=Path, default=None, help="work in this directory and keep it")
    p.add_argument("-v", "--verbose", action="store_true", help="diagnostic logging on stderr")
    args = p.parse_args(argv)
    if args.words < 1 or not 1 <= args.distinct <= args.words:
        p.error("need 1 <= --distinct <= --words")

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    kill_seed = args.kill_seed if args.kill_seed is not None else random.SystemRandom().randrange(1 << 32)
    rng = random.Random(kill_seed)

    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        workdir = args.keep.resolve()
        cleanup = None
    else:
        cleanup = tempfile.TemporaryDirectory(prefix="millpond-demo-")
        workdir = Path(cleanup.name)
    try:
        return demo(workdir, args, rng, kill_seed)
    except DemoError as exc:
        print(f"\nFAIL: {exc}")
        return 1
    except KeyboardInterrupt:
        print("\ninterrupted")
        return 130
    finally:
        if cleanup is not None:
            cleanup.cleanup()


def demo(workdir: Path, args: argparse.Namespace, rng: random.Random, kill_seed: int) -> int:
    t0 = time.monotonic()
    state, backup = workdir / "state", workdir / "backup"
    interval = ["-s", repr(args.epoch_interval)]

    print("millpond demo: word count, killed with SIGKILL, resumed, checked")
    print(f"  flow: {FLOW_FILE.relative_to(HERE.parent)} (FileSource -> count_final -> FileSink)")
    print()

    expected = write_text(workdir / "in.txt", args.words, args.distinct, args.seed)
    size = (workdir / "in.txt").stat().st_size
    print(f"1. generated in.txt: {args.words:,} words, {len(expected):,} distinct, {size / 1e6:.1f} MB (seed {args.seed})")

    # Reference: an uninterrupted run without recovery, checked against Counter.
    ref = Flow(workdir, "reference.tsv", interval)
    try:
        ref_seconds = run_to_completion(ref)
    finally:
        ref.stop()
    reference = read_counts(workdir / "reference.tsv")
    if reference != dict(expected):
        raise DemoError("the uninterrupted millpond run disagrees with collections.Counter")
    print(f"2. uninterrupted run, recovery off: {ref_seconds:.2f} s; {len(reference):,} counts, equal to collections.Counter")

    # The run that dies. Its length varies by machine; a run with recovery
    # on takes roughly 2-3x the reference run, so a random delay of up to
    # 1.2x the reference run after the first commit lands mid-run.
    max_delay = max(0.3, ref_seconds * 1.2)
    killed_at, commits = interrupted_run(workdir, state, backup, interval, rng, max_delay)
    newest = commits[-1] if commits else 0
    print(
        f"3. recovery run (-d state -b backup -s {args.epoch_interval}) killed with SIGKILL "
        f"{killed_at:.2f} s after start (kill seed {kill_seed}); newest committed epoch {newest}"
    )
    print("   python -m millpond.recovery inspect backup:")
    for line in inspect_backup(backup).splitlines():
        print("     " + line)

    # The restart: the same command.
    resumed = Flow(workdir, "counts.tsv", ["-d", str(state), "-b", str(backup), *interval])
    try:
        resumed_seconds = run_to_completion(resumed)
    finally:
        resumed.stop()
    match = next((m for m in map(RESUME_RE.search, resumed.stderr) if m), None)
    if match is None:
        raise DemoError("the restarted run logged no 'resume flow' line:\n" + "\n".join(resumed.stderr[-10:]))
    resume_epoch = int(match["epoch"])
    print(
        f"4. restarted: {match['kind']} resume of execution {match['execution']} from epoch {resume_epoch} "
        f"(after committed epoch {resume_epoch - 1}) in {float(match['seconds']) * 1000:.1f} ms "
        f"({int(match['count']):,} {match['what']}); run finished in {resumed_seconds:.2f} s"
    )
    if resume_epoch != newest + 1:
        raise DemoError(f"resumed from epoch {resume_epoch}, but the newest commit before the restart was {newest}")

    final = read_counts(workdir / "counts.tsv")
    print()
    print("top 10 words of the resumed run:")
    for word, n in sorted(final.items(), key=lambda kv: (-kv[1], kv[0]))[:10]:
        print(f"  {word:<12} {n:>8,}")
    print()

    if final != reference:
        missing = len(reference.keys() - final.keys())
        extra = len(final.keys() - reference.keys())
        wrong = sum(1 for w in reference.keys() & final.keys() if final[w] != reference[w])
        print(
            f"FAIL: the resumed run's counts differ from the uninterrupted run's: "
            f"{missing} words missing, {extra} extra, {wrong} with a different count"
        )
        return 1
    same_bytes = (workdir / "counts.tsv").read_bytes() == (workdir / "reference.tsv").read_bytes()
    print(
        f"OK: the resumed run's {len(final):,} counts ({sum(final.values()):,} words) equal the uninterrupted run's"
        + (" (output files byte-identical)" if same_bytes else " (same lines, different order)")
        + f"; demo took {time.monotonic() - t0:.1f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
