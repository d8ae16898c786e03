"""What the stable ABI (abi3, Py_LIMITED_API) would cost millpond._core.

Builds abi3bench (abi3bench.c + core.go, a cgo c-shared library like
pybindings) twice with this interpreter's headers: once against the full
C API, once with -DPy_LIMITED_API=0x030A0000 (one wheel for CPython 3.10+).
Then it times, in fresh processes that alternate between the two builds:

- call_go: a (int handle, str, str) -> int call into Go with the GIL
  released, the shape of store_get; call_c: the same without Go; noop: a
  bare call, the floor of any call from Python.
- pack_snapshot: 100k str keys -> small live objects, each .snapshot()-ed
  and pickled by pickle.dumps into one buffer handed to Go (the loop of
  pybindings/snapshot.c, without its small-int shortcut).
- pack_rows: 100k (step, key, bytes) tuples packed into one buffer (the
  loop of mp_pack_rows in pybindings/module.c).

Usage: python bench/abi3_cost/run.py [--rounds 5] [--keep DIR]
Needs Go and a C compiler (cc, or $CC). Prints ns/call and ms per 100k rows,
min and median over the rounds. Figures and the decision: docs/install.md,
"Stable ABI".
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FLAVOURS = {
    # name: (extra CFLAGS, file name of the built module)
    "full": ("", f"abi3bench{sysconfig.get_config_var('EXT_SUFFIX')}"),
    "abi3": ("-DPy_LIMITED_API=0x030A0000", "abi3bench.abi3.so"),
}
if sys.version_info >= (3, 12):
    # 3.12's stable ABI has PyObject_Vectorcall: a wheel for 3.12+ only.
    FLAVOURS["abi3.12"] = ("-DPy_LIMITED_API=0x030C0000", "abi3bench.abi3.so")
ROWS = 100_000
CALLS = 1_000_000


def build(out: Path) -> dict[str, Path]:
    include = sysconfig.get_paths()["include"]
    built = {}
    for name, (flags, filename) in FLAVOURS.items():
        d = out / name
        d.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1", CGO_CFLAGS=f"-I{include} -O2 {flags}".strip())
        subprocess.run(["go", "build", "-buildmode=c-shared", "-trimpath", "-ldflags=-s -w",
                        "-o", str(d / filename), "."], cwd=HERE, env=env, check=True)
        (d / filename).with_suffix(".h").unlink(missing_ok=True)
        built[name] = d
    return built


# -- the measuring process ----------------------------------------------------


class Live:
    """A small live state object, as a stateful step keeps per key."""

    __slots__ = ("n", "last")

    def __init__(self, n: int) -> None:
        self.n = n
        self.last = f"w{n % 977}"

    def snapshot(self) -> tuple[int, str]:
        return (self.n, self.last)


def per_call_ns(fn, args: tuple, calls: int) -> float:
    """Best of 5 timed loops of `calls` calls, in ns per call."""
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        for _ in range(calls):
            fn(*args)
        best = min(best, time.perf_counter_ns() - t)
    return best / calls


def per_batch_ms(fn, args: tuple) -> float:
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter_ns()
        fn(*args)
        best = min(best, time.perf_counter_ns() - t)
    return best / 1e6


def worker(module_dir: str) -> None:
    sys.path.insert(0, module_dir)
    import abi3bench as m

    live = {f"word-{i:07d}": Live(i) for i in range(ROWS)}
    rows = [("wordcount.count", k, pickle.dumps(v.snapshot(), pickle.HIGHEST_PROTOCOL)) for k, v in live.items()]
    proto = pickle.HIGHEST_PROTOCOL
    assert m.pack_snapshot(live, pickle.dumps, proto) > ROWS * 10
    assert m.pack_rows(rows) > ROWS * 10
    res = {
        "flavour": m.FLAVOUR,
        "file": os.path.basename(m.__file__),
        "noop": per_call_ns(m.noop, (), CALLS),
        "call_c": per_call_ns(m.call_c, (7, "wordcount.count", "apple"), CALLS),
        "call_go": per_call_ns(m.call_go, (7, "wordcount.count", "apple"), CALLS),
        "pack_snapshot": per_batch_ms(m.pack_snapshot, (live, pickle.dumps, proto)),
        "pack_rows": per_batch_ms(m.pack_rows, (rows,)),
    }
    print(json.dumps(res))


# -- the driver ---------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5, help="fresh processes per build (default 5)")
    ap.add_argument("--keep", metavar="DIR", help="build into DIR and keep it")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    opts = ap.parse_args()
    if opts.worker:
        worker(opts.worker)
        return
    tmp = None
    if opts.keep:
        out = Path(opts.keep).resolve()
    else:
        tmp = tempfile.mkdtemp(prefix="abi3-cost-")
        out = Path(tmp)
    try:
        t = time.perf_counter()
        dirs = build(out)
        print(f"built both flavours in {time.perf_counter() - t:.1f} s (Python {sys.version.split()[0]}, "
              f"{sysconfig.get_platform()})", flush=True)
        results: dict[str, list[dict]] = {name: [] for name in FLAVOURS}
        order = list(FLAVOURS)
        for r in range(opts.rounds):
            for name in order if r % 2 == 0 else list(reversed(order)):
                proc = subprocess.run([sys.executable, __file__, "--worker", str(dirs[name])],
                                      capture_output=True, text=True, check=True, timeout=600)
                res = json.loads(proc.stdout)
                assert res["flavour"] == name, res
                results[name].append(res)
            print(f"round {r + 1}/{opts.rounds} done", flush=True)
        print()
        head = f"{'measure':<30}"
        for name in FLAVOURS:
            head += f" {name + ' min':>12} {'median':>7}"
        for name in list(FLAVOURS)[1:]:
            head += f" {name + '/full':>12}"
        print(head)
        rowsk = ROWS // 1000
        for key, unit in [("noop", "ns/call"), ("call_c", "ns/call"), ("call_go", "ns/call"),
                          ("pack_snapshot", f"ms/{rowsk}k rows"), ("pack_rows", f"ms/{rowsk}k rows")]:
            line = f"{key + ' (' + unit + ')':<30}"
            med = {}
            for name in FLAVOURS:
                xs = [x[key] for x in results[name]]
                med[name] = statistics.median(xs)
                line += f" {min(xs):>12.1f} {med[name]:>7.1f}"
            for name in list(FLAVOURS)[1:]:
                line += f" {med[name] / med['full']:>12.2f}"
            print(line)
        print(f"\nmedian ratios are of the medians; {opts.rounds} processes per build, each the best of 5 loops")
    finally:
        if tmp:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
