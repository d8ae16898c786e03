"""The live-key limit (``max_live_keys``): memory, throughput and resume touch (issue 13).

Every scenario runs in its own child process (``sys.executable`` running
this file with ``child``/``direct``/``scan``; never a fork), which reports
its own peak RSS (``ru_maxrss``) and timings as one JSON line. The input is
a lazy ``DynamicSource`` (batches of 1000 ``(key, 1)`` items generated on
the fly; nothing is materialized), into ``stateful_map`` whose state is
``(count, <100 distinct bytes>)``, into a counting sink. Recovery is on
(``RecoveryConfig(local_state_dir=...)``, defaults otherwise) unless noted.

1. **resume-touch**: a first run writes N keys (default 1M) with recovery
   on; the store directory is copied once per variant, and a second run
   touches every key once (N items, key order, batches of 1000, the mapper
   adds 1) with no limit and with a 100k limit. Compared, in the same
   session, with a stdlib ``sqlite3`` scan of ``store.sqlite`` (tables
   ``snaps`` and ``recent``) unpickling every value, and with
   ``StateStore.prefetch`` + ``get`` called directly in batches of 1000
   (in key order, and without a limit also in random order)
   (plus ``hydrate_all`` and a few thousand single ``get`` for context).
2. **limited**: 5M distinct keys with a 100k limit against the unlimited
   run on 1M keys (peak RSS, items/s); **hot**: 5M items, 95% of keys from
   a hot set of 50k, 5% uniform over 5M, limit 100k against no limit
   (target >= 0.9x); **uniform 10x**: 2M items uniform over 1M keys, limit
   100k against no limit, and a cProfile (top 15 by cumulative time) of a
   separate, shorter limited run.
3. **budget** (``max_live_bytes``): 500k distinct keys with 1000-byte
   states (``(count, <1000 distinct bytes>)``), unbounded and under byte
   budgets of 256 MiB and 64 MiB: peak RSS against the budget, items/s,
   and the key limit and per-key estimate each worker logged; then, in
   this process, the estimate of a key against what ``tracemalloc``
   counts for 20,000 keys of five state shapes.

``--scale`` multiplies every count (keys, items, limits, hot-set size), so
the ratios are those of the full run at a smaller size.

    python bench/live_limit.py                 # the issue's sizes, 1 round (~11-13 min)
    python bench/live_limit.py --scale 0.05    # quick check, 3 rounds (~1 min)
    python bench/live_limit.py --only resume-touch --json /tmp/ll.json
    python bench/live_limit.py --only budget       # ~2 min
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Optional

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BATCH = 1000
FLOW_ID = "bench_live"

# -- the flow (child side) ------------------------------------------------------


def _payload(key: str, size: int = 100) -> bytes:
    """``size`` bytes, distinct per key (so nothing is shared between states)."""
    b = key.encode()
    return (b * (size // len(b) + 1))[:size]


def _mapper(state: Optional[tuple], value: bytes) -> tuple:
    """State ``(count, 100 bytes)``; the item's value is the key's payload."""
    if state is None:
        return (1, value), 1
    n = state[0] + 1
    return (n, state[1]), n


class _Gen:
    """Keys for one run: ``mode`` distinct (0..n-1 in order), hot (95% of
    a hot set, 5% uniform over ``space``) or uniform (over ``space``)."""

    def __init__(self, mode: str, items: int, space: int, hot: int, seed: int = 13, size: int = 100) -> None:
        self.mode, self.items, self.space, self.hot, self.size = mode, items, space, hot, size
        self.rng = random.Random(seed)
        self.pos = 0
        self.t_first: Optional[float] = None
        self.t_last: Optional[float] = None

    def next_batch(self) -> List[tuple]:
        if self.pos >= self.items:
            if self.t_last is None:
                self.t_last = time.perf_counter()
            raise StopIteration()
        if self.t_first is None:
            self.t_first = time.perf_counter()
        n = min(BATCH, self.items - self.pos)
        start, self.pos = self.pos, self.pos + n
        mode = self.mode
        if mode == "distinct":
            idx = range(start, start + n)
        elif mode == "uniform":
            rnd, space = self.rng.random, self.space
            idx = [int(rnd() * space) for _ in range(n)]
        else:  # hot
            idx = self._hot(n)
        out = []
        size = self.size
        for i in idx:
            k = f"k{i:09d}"
            out.append((k, _payload(k, size)))
        return out

    def _hot(self, n: int) -> List[int]:
        rnd, space, hot = self.rng.random, self.space, self.hot
        out = []
        for _ in range(n):
            r = rnd()
            if r < 0.95:
                out.append(int(r / 0.95 * hot))
            else:
                out.append(int(rnd() * space))
        return out


def build_flow(gen: _Gen):
    import millpond.operators as op
    from millpond.dataflow import Dataflow
    from millpond.inputs import DynamicSource, StatelessSourcePartition
    from millpond.outputs import DynamicSink, StatelessSinkPartition

    class Part(StatelessSourcePartition):
        def next_batch(self):
            return gen.next_batch()

    class Src(DynamicSource):
        def build(self, step_id, worker_index, worker_count):
            return Part()

    box = [0]

    class SinkPart(StatelessSinkPartition):
        def write_batch(self, items):
            box[0] += len(items)

    class Sink(DynamicSink):
        def build(self, step_id, worker_index, worker_count):
            return SinkPart()

    flow = Dataflow(FLOW_ID)
    s = op.input("inp", flow, Src())
    op.output("out", op.stateful_map("state", s, _mapper), Sink())
    return flow, box


class _Grab(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if "live keys (limit" in msg or "byte budget" in msg:
            self.lines.append(msg)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def child_flow(spec: Dict[str, Any]) -> Dict[str, Any]:
    """Run one flow as described by ``spec``; return figures."""
    from millpond.recovery import RecoveryConfig
    from millpond.testing import run_main

    grab = _Grab()
    lg = logging.getLogger("millpond")
    lg.addHandler(grab)
    lg.setLevel(logging.INFO)
    gen = _Gen(spec["mode"], spec["items"], spec.get("space", spec["items"]), spec.get("hot", 0),
               size=spec.get("size", 100))
    flow, box = build_flow(gen)
    cfg = RecoveryConfig(Path(spec["state"])) if spec.get("state") else None
    rss0 = _rss_mb()
    prof = None
    if spec.get("profile"):
        import cProfile
        prof = cProfile.Profile()
    t0 = time.perf_counter()
    if prof is not None:
        prof.enable()
    run_main(flow, epoch_interval=timedelta(seconds=spec.get("epoch_s", 10)), recovery_config=cfg,
             max_live_keys=spec.get("limit"), max_live_bytes=spec.get("budget"))
    if prof is not None:
        prof.disable()
    t1 = time.perf_counter()
    out = {
        "items": spec["items"], "out": box[0], "seconds": t1 - t0,
        "items_per_s": spec["items"] / (t1 - t0),
        "to_first_batch_s": (gen.t_first or t1) - t0,
        "input_s": (gen.t_last or t1) - (gen.t_first or t0),
        "after_input_s": t1 - (gen.t_last or t1),
        "rss_before_mb": rss0, "peak_rss_mb": _rss_mb(), "live_log": grab.lines,
    }
    if prof is not None:
        import io
        import pstats
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(15)
        out["profile_cum"] = buf.getvalue()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(12)
        out["profile_tot"] = buf.getvalue()
    return out


def _store_file(root: Path) -> Path:
    return root / FLOW_ID / "worker-0000" / "store.sqlite"


def child_scan(spec: Dict[str, Any]) -> Dict[str, Any]:
    """stdlib sqlite3: every row of snaps (and recent), values unpickled."""
    path = _store_file(Path(spec["state"]))
    t0 = time.perf_counter()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    loads = pickle.loads
    d: Dict[str, Any] = {}
    rows = 0
    for table in ("snaps", "recent"):
        if table not in tables:
            continue
        for key, value in con.execute(f"SELECT state_key, value FROM {table}"):
            rows += 1
            d[key] = loads(value) if value is not None else None
    con.close()
    dt = time.perf_counter() - t0
    return {"rows": rows, "keys": len(d), "seconds": dt, "peak_rss_mb": _rss_mb()}


def con2_epoch(root: Path) -> int:
    con = sqlite3.connect(f"file:{_store_file(root)}?mode=ro", uri=True)
    try:
        return int(con.execute("SELECT max(epoch) FROM snaps").fetchone()[0] or 0)
    finally:
        con.close()


def child_direct(spec: Dict[str, Any]) -> Dict[str, Any]:
    """StateStore.prefetch + get in batches of 1000 over every stored key."""
    from millpond.state import StateStore

    root = Path(spec["state"])
    con = sqlite3.connect(f"file:{_store_file(root)}?mode=ro", uri=True)
    step_id = con.execute("SELECT step_id FROM snaps LIMIT 1").fetchone()[0]
    keys = sorted({r[0] for r in con.execute("SELECT state_key FROM snaps WHERE step_id=?", (step_id,))})
    con.close()
    out: Dict[str, Any] = {"step_id": step_id, "keys": len(keys)}

    epoch = con2_epoch(root) + 1

    class Obj:
        """A live object over a stored value, as a step's builder makes one."""
        __slots__ = ("s",)

        def __init__(self, s: Any) -> None:
            self.s = s

        def snapshot(self) -> Any:
            return self.s

    batch = spec.get("batch", BATCH)
    # Context first (these only read): one streaming pass, and single gets
    # without a prefetch.
    store = StateStore.open(root, FLOW_ID)
    store.register(step_id, Obj)
    t0 = time.perf_counter()
    n = store.hydrate_all(step_id)
    out["hydrate_all"] = {"seconds": time.perf_counter() - t0, "keys": n}
    store.close()
    store = StateStore.open(root, FLOW_ID)
    store.register(step_id, Obj)
    sample = keys[:: max(1, len(keys) // 5000)]
    t0 = time.perf_counter()
    for k in sample:
        store.get(step_id, k)
    dt = time.perf_counter() - t0
    out["single_get"] = {"keys": len(sample), "us_per_key": dt / len(sample) * 1e6}
    store.close()
    # No limit in key order and in random order (a flow whose batches
    # scatter over the keys), then the limit (last: its evictions write the
    # touched keys).
    scattered = list(keys)
    random.Random(0).shuffle(scattered)
    for name, limit, order in (("nolimit", None, keys), ("nolimit_random", None, scattered),
                               ("limit", spec.get("limit"), keys)):
        store = StateStore.open(root, FLOW_ID)
        store.register(step_id, Obj, evictable=True)
        store.limit_live_keys(limit)
        t0 = time.perf_counter()
        got = 0
        for i in range(0, len(order), batch):
            chunk = order[i:i + batch]
            store.prefetch(step_id, chunk)
            for k in chunk:
                if store.get(step_id, k) is not None:
                    got += 1
            if limit is not None:
                store.evict(epoch)
        dt = time.perf_counter() - t0
        s = store.live_stats
        out[name] = {
            "seconds": dt, "us_per_key": dt / len(keys) * 1e6, "got": got,
            "hydrate_calls": s.hydrate_calls, "hydrated": s.hydrated, "single_gets": s.single_gets,
            "evicted": s.evicted, "spilled": s.spilled,
        }
        store.close()
    out["peak_rss_mb"] = _rss_mb()
    return out


# -- parent side --------------------------------------------------------------


def run_child(kind: str, spec: Dict[str, Any], timeout: float = 3600) -> Dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), kind, json.dumps(spec)]
    env = dict(os.environ)
    env.pop("MILLPOND_MAX_LIVE_KEYS", None)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} {spec} exited {proc.returncode}: {proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def sc(n: int, scale: float) -> int:
    return max(1, int(round(n * scale)))


def fresh(tmp: Path, name: str) -> Path:
    d = tmp / name
    if d.exists():
        shutil.rmtree(d)
    return d


def resume_touch(scale: float, tmp: Path, repeat: int) -> Dict[str, Any]:
    n = sc(1_000_000, scale)
    limit = sc(100_000, scale)
    pristine = tmp / "touch-pristine"
    w = run_child("child", {"mode": "distinct", "items": n, "state": str(pristine), "epoch_s": 3600})
    res: Dict[str, Any] = {"keys": n, "limit": limit, "write": w,
                           "store_mb": _store_file(pristine).stat().st_size / 1e6}
    print(f"  wrote {n} keys in {w['seconds']:.1f} s", flush=True)
    runs: Dict[str, List[Dict[str, Any]]] = {"scan": [], "flow_nolimit": [], "flow_limit": []}
    for r in range(repeat):
        runs["scan"].append(run_child("scan", {"state": str(pristine)}))
        for name, lim in (("flow_nolimit", None), ("flow_limit", limit)):
            d = fresh(tmp, "touch-run")
            shutil.copytree(pristine, d)
            runs[name].append(run_child("child", {"mode": "distinct", "items": n, "state": str(d),
                                                  "epoch_s": 3600, "limit": lim}))
            shutil.rmtree(d)
        print(f"  round {r + 1}: scan {runs['scan'][-1]['seconds']:.2f} s, touch no limit "
              f"{runs['flow_nolimit'][-1]['input_s']:.2f} s, limit {runs['flow_limit'][-1]['input_s']:.2f} s",
              flush=True)
    for k, v in runs.items():
        res[k] = min(v, key=lambda x: x["seconds"] if k == "scan" else x["input_s"])
        res[k + "_all"] = [x["seconds"] if k == "scan" else x["input_s"] for x in v]
    direct = []
    for _ in range(repeat):
        d = fresh(tmp, "direct-run")
        shutil.copytree(pristine, d)
        direct.append(run_child("direct", {"state": str(d), "limit": limit}))
        shutil.rmtree(d)
    res["direct"] = min(direct, key=lambda x: x["nolimit"]["seconds"])
    res["direct_limit_us_all"] = [x["limit"]["us_per_key"] for x in direct]
    res["direct_nolimit_us_all"] = [x["nolimit"]["us_per_key"] for x in direct]
    shutil.rmtree(pristine)
    return res


def limited(scale: float, tmp: Path, repeat: int) -> Dict[str, Any]:
    big, base, limit, hot = sc(5_000_000, scale), sc(1_000_000, scale), sc(100_000, scale), sc(50_000, scale)
    res: Dict[str, Any] = {"big": big, "base": base, "limit": limit, "hot_keys": hot}

    def go(spec: Dict[str, Any]) -> Dict[str, Any]:
        d = fresh(tmp, "lim-run")
        r = run_child("child", dict(spec, state=str(d)))
        shutil.rmtree(d, ignore_errors=True)
        return r

    # 1. 5M distinct, limited, vs 1M distinct unlimited.
    res["distinct_base"] = go({"mode": "distinct", "items": base})
    print(f"  unlimited {base} keys: {res['distinct_base']['items_per_s']:,.0f}/s, "
          f"{res['distinct_base']['peak_rss_mb']:.0f} MB", flush=True)
    res["distinct_limited"] = go({"mode": "distinct", "items": big, "limit": limit})
    print(f"  limited {big} keys: {res['distinct_limited']['items_per_s']:,.0f}/s, "
          f"{res['distinct_limited']['peak_rss_mb']:.0f} MB", flush=True)
    # 2. Hot working set and 3. uniform 10x: pairs, order alternating per round.
    for name, spec in (
        ("hot", {"mode": "hot", "items": big, "space": big, "hot": hot}),
        ("uniform", {"mode": "uniform", "items": 2 * base, "space": base}),
    ):
        pairs = []
        for r in range(repeat):
            order = [None, limit] if r % 2 == 0 else [limit, None]
            got = {}
            for lim in order:
                got[lim] = go(dict(spec, limit=lim))
            pairs.append({"nolimit": got[None], "limit": got[limit],
                          "ratio": got[limit]["items_per_s"] / got[None]["items_per_s"]})
            print(f"  {name} round {r + 1}: no limit {got[None]['items_per_s']:,.0f}/s, limit "
                  f"{got[limit]['items_per_s']:,.0f}/s, ratio {pairs[-1]['ratio']:.2f}", flush=True)
        res[name] = pairs
    prof_items = max(BATCH, (2 * base) // 4)
    try:
        res["uniform_profile"] = go({"mode": "uniform", "items": prof_items, "space": base, "limit": limit,
                                     "profile": True})
    except RuntimeError as exc:  # reported, not fatal: the figures above stand
        print(f"  profiled run failed: {exc}", flush=True)
        res["uniform_profile_error"] = str(exc)[-3000:]
    return res


BUDGETS_MIB = (256, 64)


def budget(scale: float, tmp: Path, repeat: int) -> Dict[str, Any]:
    keys = sc(500_000, scale)
    res: Dict[str, Any] = {"keys": keys, "state_bytes": 1000, "runs": []}
    for r in range(repeat):
        for mib in (None,) + BUDGETS_MIB:
            spec: Dict[str, Any] = {"mode": "distinct", "items": keys, "size": 1000,
                                    "state": str(fresh(tmp, "budget"))}
            if mib is not None:
                spec["budget"] = max(1, int(mib * scale * (1 << 20)))
            got = run_child("child", spec)
            got["budget_mib"] = None if mib is None else spec["budget"] / (1 << 20)
            res["runs"].append(got)
            print(f"  round {r + 1}, budget {got['budget_mib'] or 'none'} MiB: {got['items_per_s']:,.0f}/s, "
                  f"peak RSS {got['peak_rss_mb']:.0f} MB", flush=True)
    res["accuracy"] = estimate_accuracy(sc(20_000, scale))
    return res


# State shapes whose per-key estimate estimate_accuracy checks.
_SHAPES: Dict[str, Any] = {
    "list of 10 ints": lambda i: [i * 1000 + j for j in range(10)],
    "dict of 5 floats": lambda i: {f"f{j}": i * 1.5 + j for j in range(5)},
    "1000 bytes": lambda i: bytes(1000) + str(i).encode(),
    "int": lambda i: i * 100_000,
    "tuple(str, 4 pairs)": lambda i: (f"user-{i}", [(j, f"v{j}-{i}") for j in range(4)]),
}


def estimate_accuracy(keys: int) -> Dict[str, Dict[str, float]]:
    """Per state shape: what tracemalloc counts for ``keys`` keys and their
    states held in one dict, a key, against the byte budget's estimate of a
    key (which adds KEY_OVERHEAD_BYTES for the store's dict entries)."""
    import tracemalloc

    from millpond.livelimit import ByteBudget

    out: Dict[str, Dict[str, float]] = {}
    for name, make in _SHAPES.items():
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        states = {f"key-{i:07d}": make(i) for i in range(keys)}
        counted = (tracemalloc.get_traced_memory()[0] - before) / keys
        tracemalloc.stop()
        budget = ByteBudget(1 << 40)
        budget.keys_for([states])
        assert budget.per_key is not None
        out[name] = {"tracemalloc": counted, "estimate": budget.per_key, "ratio": budget.per_key / counted}
        print(f"  {name:24s} tracemalloc {counted:6.0f} B a key, estimate {budget.per_key:6.0f} "
              f"({budget.per_key / counted:.2f}x)", flush=True)
    return out


def fmt_report(out: Dict[str, Any]) -> str:
    lines = []
    rt = out.get("resume-touch")
    if rt:
        n = rt["keys"]
        scan = rt["scan"]["seconds"]
        lines.append(f"resume-touch: {n:,} stored keys (store {rt['store_mb']:.0f} MB), limit {rt['limit']:,}")
        lines.append(f"  {'what':44s} {'s':>7s} {'us/key':>7s} {'x scan':>7s}")
        lines.append(f"  {'sqlite3 scan + unpickle (stdlib)':44s} {scan:7.2f} {scan / n * 1e6:7.2f} {1.0:7.2f}")
        for name, label in (("flow_nolimit", "flow touch, no limit"), ("flow_limit", "flow touch, limit")):
            f = rt[name]
            lines.append(f"  {label + ' (input start..end)':44s} {f['input_s']:7.2f} {f['input_s'] / n * 1e6:7.2f} "
                         f"{f['input_s'] / scan:7.2f}")
            lines.append(f"  {label + ' (whole run_main)':44s} {f['seconds']:7.2f} {f['seconds'] / n * 1e6:7.2f} "
                         f"{f['seconds'] / scan:7.2f}   (open {f['to_first_batch_s']:.2f} s, "
                         f"after input {f['after_input_s']:.2f} s, peak RSS {f['peak_rss_mb']:.0f} MB)")
            for ln in f["live_log"]:
                lines.append(f"      log: {ln}")
        d = rt["direct"]
        for name, label in (("nolimit", "StateStore.prefetch+get x1000, no limit"),
                            ("nolimit_random", "  the same, keys in random order"),
                            ("limit", "StateStore.prefetch+get x1000, limit")):
            if name not in d:
                continue
            x = d[name]
            lines.append(f"  {label:44s} {x['seconds']:7.2f} {x['us_per_key']:7.2f} {x['seconds'] / scan:7.2f}"
                         f"   ({x['hydrate_calls']} multi-gets, {x['single_gets']} single)")
        ha = d["hydrate_all"]
        lines.append(f"  {'StateStore.hydrate_all':44s} {ha['seconds']:7.2f} {ha['seconds'] / n * 1e6:7.2f} "
                     f"{ha['seconds'] / scan:7.2f}")
        lines.append(f"  {'StateStore.get one at a time (sample)':44s} {'':7s} {d['single_get']['us_per_key']:7.2f}")
        lines.append(f"  rounds (s): scan {fmt_list(rt['scan_all'])}; touch no limit {fmt_list(rt['flow_nolimit_all'])}; "
                     f"limit {fmt_list(rt['flow_limit_all'])}; direct us/key no limit "
                     f"{fmt_list(rt['direct_nolimit_us_all'])}, limit {fmt_list(rt['direct_limit_us_all'])}")
    lm = out.get("limited")
    if lm:
        b, l_ = lm["distinct_base"], lm["distinct_limited"]
        lines.append(f"limited: limit {lm['limit']:,}, hot set {lm['hot_keys']:,}")
        lines.append(f"  {'run':44s} {'items/s':>10s} {'peak RSS':>9s} {'seconds':>8s}")
        lines.append(f"  {'unlimited, %s distinct keys' % format(lm['base'], ','):44s} "
                     f"{b['items_per_s']:10,.0f} {b['peak_rss_mb']:7.0f}MB {b['seconds']:8.1f}")
        lines.append(f"  {'limit, %s distinct keys' % format(lm['big'], ','):44s} "
                     f"{l_['items_per_s']:10,.0f} {l_['peak_rss_mb']:7.0f}MB {l_['seconds']:8.1f}"
                     f"   ({l_['items_per_s'] / b['items_per_s']:.2f}x the unlimited items/s)")
        for ln in l_["live_log"]:
            lines.append(f"      log: {ln}")
        for name, label in (("hot", "hot working set"), ("uniform", "uniform over 10x the limit")):
            pairs = lm[name]
            ratios = [p["ratio"] for p in pairs]
            med = statistics.median(ratios)
            best_n = max(p["nolimit"]["items_per_s"] for p in pairs)
            best_l = max(p["limit"]["items_per_s"] for p in pairs)
            rss_n = max(p["nolimit"]["peak_rss_mb"] for p in pairs)
            rss_l = max(p["limit"]["peak_rss_mb"] for p in pairs)
            lines.append(f"  {label + ', no limit':44s} {best_n:10,.0f} {rss_n:7.0f}MB")
            lines.append(f"  {label + ', limit':44s} {best_l:10,.0f} {rss_l:7.0f}MB"
                         f"   ratio per round {fmt_list(ratios)}, median {med:.2f}")
            for ln in pairs[0]["limit"]["live_log"]:
                lines.append(f"      log: {ln}")
        p = lm.get("uniform_profile")
        if p is None:
            lines.append("  profiled run failed: " + lm.get("uniform_profile_error", "?")[-600:])
            return "\n".join(lines)
        lines.append(f"  cProfile of a limited uniform run ({p['items']:,} items, {p['seconds']:.1f} s under the profiler):")
        lines.append(p["profile_cum"])
        lines.append(p["profile_tot"])
    bd = out.get("budget")
    if bd:
        lines.append(f"budget: {bd['keys']:,} distinct keys, {bd['state_bytes']}-byte states")
        lines.append(f"  {'run':44s} {'items/s':>10s} {'peak RSS':>9s} {'seconds':>8s}")
        for run in bd["runs"]:
            label = "no budget" if run["budget_mib"] is None else f"--max-live-bytes {run['budget_mib']:g}MiB"
            lines.append(f"  {label:44s} {run['items_per_s']:10,.0f} {run['peak_rss_mb']:7.0f}MB {run['seconds']:8.1f}")
            for ln in run["live_log"]:
                lines.append(f"      log: {ln}")
        for name, a in bd.get("accuracy", {}).items():
            lines.append(f"  estimate of a key, {name}: {a['estimate']:.0f} B against tracemalloc's "
                         f"{a['tracemalloc']:.0f} B ({a['ratio']:.2f}x)")
    return "\n".join(lines)


def fmt_list(xs: List[float]) -> str:
    return "[" + ", ".join(f"{x:.2f}" for x in xs) + "]"


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] in ("child", "scan", "direct"):
        sys.path.insert(0, str(HERE))
        fn = {"child": child_flow, "scan": child_scan, "direct": child_direct}[sys.argv[1]]
        print(json.dumps(fn(json.loads(sys.argv[2]))), flush=True)
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=None, help="rounds (default 3 below scale 0.2, else 1)")
    ap.add_argument("--only", choices=["resume-touch", "limited", "budget"], action="append")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--report", type=Path, help="only print the table of a --json file")
    ap.add_argument("--tmp", type=Path, default=None, help="directory for the state (default: system temp)")
    args = ap.parse_args()
    if args.report:
        print(fmt_report(json.loads(args.report.read_text())))
        return
    repeat = args.repeat or (3 if args.scale < 0.2 else 1)
    tmp = Path(tempfile.mkdtemp(prefix="mp-livelimit-", dir=args.tmp))
    out: Dict[str, Any] = {"scale": args.scale, "repeat": repeat, "python": sys.version.split()[0],
                           "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}
    try:
        only = args.only or ["resume-touch", "limited", "budget"]
        if "resume-touch" in only:
            print("resume-touch ...", flush=True)
            out["resume-touch"] = resume_touch(args.scale, tmp, repeat)
            if args.json:
                args.json.write_text(json.dumps(out, indent=1))
        if "limited" in only:
            print("limited ...", flush=True)
            out["limited"] = limited(args.scale, tmp, repeat)
            if args.json:
                args.json.write_text(json.dumps(out, indent=1))
        if "budget" in only:
            print("budget ...", flush=True)
            out["budget"] = budget(args.scale, tmp, repeat)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    print()
    print(fmt_report(out))


if __name__ == "__main__":
    main()
