"""Kafka -> word count -> Kafka: millpond's Kafka connector against Bytewax 0.21.1 (issue 15).

One real single-node Kafka broker (``tools/kafka/broker.py``, started and
always stopped by this script) serves the whole run. The input topic (6
partitions) is filled once with ``--messages`` records (default 1M): each a
line of 1-3 words (uniform, 2 on average) drawn from a fixed vocabulary of
10,000 pseudo-words with Zipf(1) frequencies (seeded), no key, spread round
robin over the partitions.

The flow, the same on both systems (their own public APIs):

    KafkaSource(brokers, [topic], tail=False)        # read the topic to its end
    flat_map("split")    line -> its words
    key_on("key")        word -> (word, word)
    stateful_map("count") running count per word, emitted for every word
    map("msg")           KafkaSinkMessage(key=word, value=str(count))
    KafkaSink(brokers, out_topic)                    # 6 partitions, a fresh topic per run

so the output has one record per word read (about 2x the input's records;
in bytes of keys and values about the same as the input). Configurations:

    mp-off   millpond, recovery off (at-least-once sink, nothing persisted)
    mp-alo   millpond, at-least-once sink, recovery on (-d DIR -b DIR, temp dirs)
    mp-eo    millpond, KafkaSink(exactly_once=True), recovery on
    bw-off   Bytewax 0.21.1 + bytewax.connectors.kafka, no recovery
    bw-rec   Bytewax 0.21.1, recovery on (python -m bytewax.recovery DIR 1;
             then -r DIR -s INTERVAL -b 0)

Every run is its own process (``python -m millpond.run`` with this venv's
python, ``python -m bytewax.run`` with the Bytewax venv's), ``-w 1``
(``--workers``), with
the input already in the topic; the time is the process's wall clock from
spawn to exit (interpreter start, imports, connecting, the run, the final
commit and flush: nothing subtracted). items/s = input messages / that time.
Each configuration runs ``--rounds`` times, interleaved (A B C D E, A B C D
E); the table gives medians and ratios against millpond recovery off of the
same round.

Epoch / snapshot interval (``--intervals``): ``default`` passes no ``-s``
where a system has a default (millpond: 10 s; Bytewax without recovery:
10 s) and ``-s 10`` to Bytewax with recovery (which requires one); a number
passes that ``-s`` to every run. Default: ``default,1``.

After every run the output topic is read back (``isolation.level=
read_committed``) and checked: per word, the last value equals the expected
count (computed in Python); every count 1..n appears (none lost); the record
count equals the number of words (exactly-once: exactly; at-least-once: at
least).

    .venv/bin/python bench/kafka_wordcount.py                 # 1M messages, 2 rounds, two intervals
    .venv/bin/python bench/kafka_wordcount.py --quick         # 50k messages, 1 round, a smoke run
    .venv/bin/python bench/kafka_wordcount.py --only mp-off,mp-eo --intervals 1 --profile /tmp/prof

The Bytewax venv is ``--bytewax-venv`` (default ``/work/bench-venvs/bytewax``,
as ``bench/cluster_scaling.py``); it is created with bytewax==0.21.1 from
PyPI when missing, and confluent-kafka (the version this interpreter has)
is installed into it when missing.

This module imports only the standard library at the top: the Bytewax
venv imports it too (``kafka_wordcount:bw_flow(...)``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
BW_VENV_DEFAULT = Path("/work/bench-venvs/bytewax")
PARTITIONS = 6
VOCAB = 10_000
RUN_TIMEOUT_S = 1800.0
CONFIGS = ("mp-off", "mp-alo", "mp-eo", "bw-off", "bw-rec")
LABELS = {
    "mp-off": "millpond, recovery off",
    "mp-alo": "millpond, at-least-once + recovery",
    "mp-eo": "millpond, exactly-once + recovery",
    "bw-off": "Bytewax 0.21.1, no recovery",
    "bw-rec": "Bytewax 0.21.1, recovery",
}


# -- the flow, on both systems --------------------------------------------------


def _split(msg: Any) -> List[str]:
    return msg.value.decode().split()


def _word(w: str) -> str:
    return w


def _count(n: Optional[int], _w: str) -> Tuple[int, int]:
    n = (n or 0) + 1
    return n, n


def mp_flow(brokers: str, src: str, dst: str, exactly_once: bool = False, name: str = "kafka_wc") -> Any:
    """The millpond flow (run by ``python -m millpond.run``)."""
    import millpond.operators as op
    from millpond.connectors.kafka import KafkaSinkMessage, KafkaSink, KafkaSource
    from millpond.dataflow import Dataflow

    def msg(kv: Tuple[str, int]) -> Any:
        return KafkaSinkMessage(kv[0].encode(), str(kv[1]).encode())

    flow = Dataflow(name)
    lines = op.input("in", flow, KafkaSource([brokers], [src], tail=False))
    words = op.flat_map("split", lines, _split)
    counts = op.stateful_map("count", op.key_on("key", words, _word), _count)
    op.output("out", op.map("msg", counts, msg), KafkaSink([brokers], dst, exactly_once=exactly_once))
    return flow


def bw_flow(brokers: str, src: str, dst: str, name: str = "kafka_wc") -> Any:
    """The same flow on Bytewax 0.21.1 (run by its ``python -m bytewax.run``)."""
    import bytewax.operators as op
    from bytewax.connectors.kafka import KafkaSinkMessage, KafkaSink, KafkaSource
    from bytewax.dataflow import Dataflow

    def msg(kv: Tuple[str, int]) -> Any:
        return KafkaSinkMessage(kv[0].encode(), str(kv[1]).encode())

    flow = Dataflow(name)
    lines = op.input("in", flow, KafkaSource([brokers], [src], tail=False))
    words = op.flat_map("split", lines, _split)
    counts = op.stateful_map("count", op.key_on("key", words, _word), _count)
    op.output("out", op.map("msg", counts, msg), KafkaSink([brokers], dst))
    return flow


# -- input ----------------------------------------------------------------------


def vocabulary(seed: int) -> List[str]:
    rnd = random.Random(seed)
    syll = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "de", "pa", "zu", "be", "go", "ha", "fi", "xe",
            "an", "or", "el", "um"]
    words: List[str] = []
    seen = set()
    while len(words) < VOCAB:
        w = "".join(rnd.choice(syll) for _ in range(rnd.randint(2, 5)))
        if w not in seen:
            seen.add(w)
            words.append(w)
    return words


def make_lines(n: int, seed: int) -> Tuple[List[bytes], Counter]:
    vocab = vocabulary(seed)
    rnd = random.Random(seed + 1)
    cum: List[float] = []
    acc = 0.0
    for rank in range(1, VOCAB + 1):
        acc += 1.0 / rank
        cum.append(acc)
    lens = [rnd.randint(1, 3) for _ in range(n)]
    flat = rnd.choices(vocab, cum_weights=cum, k=sum(lens))
    lines: List[bytes] = []
    i = 0
    for k in lens:
        lines.append(" ".join(flat[i:i + k]).encode())
        i += k
    return lines, Counter(flat)


def load_broker_module() -> Any:
    spec = importlib.util.spec_from_file_location("mp_kafka_broker", REPO / "tools" / "kafka" / "broker.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def create_topic(bootstrap: str, name: str, partitions: int = PARTITIONS) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    fut = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)
    fut[name].result(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the metadata of every partition is out
        md = admin.list_topics(topic=name, timeout=10)
        t = md.topics.get(name)
        if t is not None and t.error is None and len(t.partitions) == partitions and all(
                p.leader >= 0 for p in t.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} not ready")


def fill(bootstrap: str, topic: str, lines: List[bytes]) -> float:
    from confluent_kafka import Producer

    failed: List[str] = []

    def cb(err: Any, _m: Any) -> None:
        if err is not None and len(failed) < 5:
            failed.append(str(err))

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                  "queue.buffering.max.messages": 500_000, "enable.idempotence": True})
    t0 = time.perf_counter()
    produce = p.produce
    for i, line in enumerate(lines):
        part = i % PARTITIONS
        while True:
            try:
                produce(topic, line, None, part, on_delivery=cb)
                break
            except BufferError:
                p.poll(0.05)
        if i % 10_000 == 0:
            p.poll(0)
    left = p.flush(120)
    if left or failed:
        raise RuntimeError(f"filling {topic}: {left} undelivered, errors {failed}")
    return time.perf_counter() - t0


def read_back(bootstrap: str, topic: str) -> Dict[str, Any]:
    """Every record of ``topic`` (read_committed): per key its values in order."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"verify-{topic}", "enable.auto.commit": False,
                  "isolation.level": "read_committed", "enable.partition.eof": True,
                  "fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20})
    try:
        parts = [TopicPartition(topic, p, 0) for p in range(PARTITIONS)]
        c.assign(parts)
        vals: Dict[bytes, List[int]] = {}
        eof = set()
        records = 0
        deadline = time.monotonic() + 300
        while len(eof) < PARTITIONS:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reading {topic} back did not reach the end of {PARTITIONS - len(eof)} partitions")
            for m in c.consume(10_000, 1.0):
                err = m.error()
                if err is None:
                    records += 1
                    k = m.key()
                    lst = vals.get(k)
                    if lst is None:
                        vals[k] = lst = []
                    lst.append(int(m.value()))
                elif err.code() == KafkaError._PARTITION_EOF:
                    eof.add(m.partition())
                else:
                    raise RuntimeError(f"reading {topic}: {err}")
        return {"records": records, "values": vals}
    finally:
        c.close()


def verify(got: Dict[str, Any], expected: Counter, exact: bool) -> Tuple[bool, str]:
    vals: Dict[bytes, List[int]] = got["values"]
    total = sum(expected.values())
    problems: List[str] = []
    if set(vals) != {w.encode() for w in expected}:
        problems.append(f"{len(vals)} keys in the output, {len(expected)} expected")
    wrong_last = lost = dup_keys = 0
    for w, n in expected.items():
        v = vals.get(w.encode(), [])
        if not v or v[-1] != n:
            wrong_last += 1
        if len(v) != n:
            dup_keys += 1
            if len(set(v)) != n or min(v) != 1 or max(v) != n:
                lost += 1
        elif sum(v) != n * (n + 1) // 2:
            lost += 1
    if wrong_last:
        problems.append(f"{wrong_last} words whose last output is not their count")
    if lost:
        problems.append(f"{lost} words missing some running count")
    recs = got["records"]
    if exact and recs != total:
        problems.append(f"{recs:,} records, exactly {total:,} expected")
    if not exact and recs < total:
        problems.append(f"{recs:,} records, at least {total:,} expected")
    note = f"{recs:,} records ({recs - total:+,} vs words), {len(vals):,} keys"
    if dup_keys and not lost:
        note += f", {dup_keys} words with repeated counts"
    return (not problems), note + ("; " + "; ".join(problems) if problems else "; counts OK")


# -- Bytewax venv ------------------------------------------------------------------


def ensure_bytewax(venv: Path) -> Tuple[Optional[Path], str]:
    """(python of the Bytewax venv, "") or (None, why it is unavailable):
    bench/cluster_scaling.py's venv, plus confluent-kafka for Bytewax's
    Kafka connector."""
    # Imported here, not at the top: millpond.run also loads this file as
    # a flow module, where bench/ is not importable; the script that calls
    # this runs with bench/ on sys.path.
    import cluster_scaling as scaling

    py, why = scaling.ensure_bytewax(venv)
    if py is None:
        return None, why
    r = subprocess.run([str(py), "-c", "import confluent_kafka"], capture_output=True, text=True)
    if r.returncode != 0:
        try:
            pkg = f"confluent-kafka=={importlib.metadata.version('confluent-kafka')}"
        except importlib.metadata.PackageNotFoundError:
            pkg = "confluent-kafka"
        print(f"installing {pkg} into {venv} (Bytewax's Kafka connector needs it) ...", flush=True)
        cmd = [str(venv / "bin" / "pip"), "install", "--quiet", pkg]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            return None, f"{' '.join(cmd)} failed ({r.returncode}): {(r.stderr or r.stdout).strip()[-500:]}"
    return py, ""


# -- runs ---------------------------------------------------------------------------


def _proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) of a live process, from /proc."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def _tree_cpu(root: int) -> float:
    """CPU seconds of ``root`` and its live descendants (the broker runs as
    a JVM under a watchdog shell)."""
    children: Dict[int, List[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(d))
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        c = _proc_cpu(pid)
        if c == c:
            total += c
        todo.extend(children.get(pid, []))
    return total


def _machine_cpu() -> Tuple[float, float]:
    """(busy, total) jiffies of the whole machine."""
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    return float(sum(vals) - idle), float(sum(vals))


class Bench:
    def __init__(self, args: argparse.Namespace, broker: Any, bw_py: Optional[Path], tmp: Path,
                 lines_n: int, expected: Counter, in_topic: str) -> None:
        self.args = args
        self.broker = broker
        self.bw_py = bw_py
        self.tmp = tmp
        self.lines_n = lines_n
        self.expected = expected
        self.in_topic = in_topic
        self.seq = 0
        self.logdir = args.logs or (tmp / "logs")
        self.logdir.mkdir(parents=True, exist_ok=True)

    def run(self, config: str, interval: str, rnd: int) -> Dict[str, Any]:
        self.seq += 1
        tag = f"{config.replace('-', '')}_{interval.replace('.', 'p')}_{rnd}_{self.seq}"
        out_topic = f"wc-out-{tag}"
        create_topic(self.broker.bootstrap, out_topic)
        work = Path(tempfile.mkdtemp(prefix=f"{tag}-", dir=self.tmp))
        bs = self.broker.bootstrap
        env = dict(os.environ)
        if config.startswith("mp-"):
            eo = config == "mp-eo"
            expr = f"{HERE / 'kafka_wordcount.py'}:mp_flow({bs!r}, {self.in_topic!r}, {out_topic!r}, {eo}, {'wc_' + tag!r})"
            cmd = [sys.executable]
            if self.args.profile:
                self.args.profile.mkdir(parents=True, exist_ok=True)
                cmd += ["-m", "cProfile", "-o", str(self.args.profile / f"{tag}.prof")]
            cmd += ["-m", "millpond.run", expr, "-w", str(self.args.workers)]
            if interval != "default":
                cmd += ["-s", interval]
            if config != "mp-off":
                cmd += ["-d", str(work / "state"), "-b", str(work / "backup")]
            cwd = REPO
        else:
            assert self.bw_py is not None
            expr = f"kafka_wordcount:bw_flow({bs!r}, {self.in_topic!r}, {out_topic!r}, {'wc_' + tag!r})"
            cmd = [str(self.bw_py), "-m", "bytewax.run", expr, "-w", str(self.args.workers)]
            if config == "bw-rec":
                rdir = work / "recovery"
                rdir.mkdir()
                subprocess.run([str(self.bw_py), "-m", "bytewax.recovery", str(rdir), "1"], check=True,
                               capture_output=True, timeout=120)
                cmd += ["-s", "10" if interval == "default" else interval, "-r", str(rdir), "-b", "0"]
            elif interval != "default":
                cmd += ["-s", interval]
            cwd = HERE
        os.sync()
        if self.args.calm_wait > 0:
            self.wait_calm()
        log_path = self.logdir / f"{tag}.log"
        load = os.getloadavg()[0]
        broker_cpu0 = _tree_cpu(self.broker.proc.pid)
        m0 = _machine_cpu()
        ru0 = os.times()
        with open(log_path, "wb") as log:
            t0 = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT)
            try:
                code = proc.wait(timeout=RUN_TIMEOUT_S)
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            wall = time.perf_counter() - t0
        ru1 = os.times()
        m1 = _machine_cpu()
        broker_cpu = _tree_cpu(self.broker.proc.pid) - broker_cpu0
        flow_cpu = (ru1.children_user - ru0.children_user) + (ru1.children_system - ru0.children_system)
        hz = os.sysconf("SC_CLK_TCK")
        machine_busy = (m1[0] - m0[0]) / hz
        others = max(0.0, machine_busy - flow_cpu - broker_cpu) / wall
        res: Dict[str, Any] = {
            "config": config, "interval": interval, "round": rnd, "seconds": wall,
            "items_per_s": self.lines_n / wall, "words_per_s": sum(self.expected.values()) / wall,
            "flow_cpu_s": flow_cpu, "broker_cpu_s": broker_cpu, "others_cores": others,
            "load_at_start": load, "log": str(log_path), "exit": code,
        }
        if code != 0:
            tail = log_path.read_text(errors="replace")[-3000:]
            res.update(ok=False, check=f"exited {code}: {tail}")
        else:
            t1 = time.perf_counter()
            got = read_back(bs, out_topic)
            ok, note = verify(got, self.expected, exact=(config == "mp-eo"))
            res.update(ok=ok, check=note, verify_s=time.perf_counter() - t1, out_records=got["records"])
        self._drop_topic(out_topic)
        shutil.rmtree(work, ignore_errors=True)
        return res

    def wait_calm(self) -> None:
        """Wait (at most --calm-wait s) until the rest of the machine, the
        broker left out, used less than --max-others cores over 2 s."""
        deadline = time.monotonic() + self.args.calm_wait
        hz = os.sysconf("SC_CLK_TCK")
        while True:
            m0, b0 = _machine_cpu(), _tree_cpu(self.broker.proc.pid)
            time.sleep(2.0)
            m1, b1 = _machine_cpu(), _tree_cpu(self.broker.proc.pid)
            used = ((m1[0] - m0[0]) / hz - (b1 - b0)) / 2.0
            if used < self.args.max_others or time.monotonic() >= deadline:
                if used >= self.args.max_others:
                    print(f"    (machine still busy: {used:.2f} cores used by others; running anyway)", flush=True)
                return

    def _drop_topic(self, name: str) -> None:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": self.broker.bootstrap})
        try:
            admin.delete_topics([name], operation_timeout=30)[name].result(60)
        except Exception as ex:  # noqa: BLE001 - a leftover topic only costs disk
            print(f"    (could not delete {name}: {ex})", flush=True)


# -- report -------------------------------------------------------------------------


def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def summarize(results: List[Dict[str, Any]], intervals: List[str], configs: List[str]) -> Dict[str, Any]:
    summary: Dict[str, Any] = {}
    for iv in intervals:
        rows: Dict[str, Any] = {}
        by_round: Dict[int, Dict[str, Dict[str, Any]]] = {}
        for r in results:
            if r["interval"] == iv and r.get("ok"):
                by_round.setdefault(r["round"], {})[r["config"]] = r
        for c in configs:
            runs = [r for r in results if r["interval"] == iv and r["config"] == c]
            good = [r for r in runs if r.get("ok")]
            ratios = [rr[c]["items_per_s"] / rr["mp-off"]["items_per_s"]
                      for rr in by_round.values() if c in rr and "mp-off" in rr]
            rows[c] = {
                "runs": len(runs), "ok": len(good),
                "items_per_s": _med([r["items_per_s"] for r in good]),
                "words_per_s": _med([r["words_per_s"] for r in good]),
                "seconds": [round(r["seconds"], 2) for r in runs],
                "vs_mp_off": _med(ratios), "vs_mp_off_rounds": ratios,
                "flow_cpu_s": _med([r["flow_cpu_s"] for r in good]),
                "broker_cpu_s": _med([r["broker_cpu_s"] for r in good]),
                "others_cores": max([r["others_cores"] for r in runs], default=float("nan")),
            }
        pairs = {}
        for a, b in (("mp-alo", "bw-rec"), ("mp-off", "bw-off")):
            xs = [rr[a]["items_per_s"] / rr[b]["items_per_s"] for rr in by_round.values() if a in rr and b in rr]
            pairs[f"{a}/{b}"] = {"median": _med(xs), "rounds": xs}
        summary[iv] = {"rows": rows, "pairs": pairs}
    return summary


def print_summary(summary: Dict[str, Any], configs: List[str]) -> None:
    for iv, s in summary.items():
        label = "default (millpond 10 s, Bytewax 10 s; Bytewax recovery -s 10)" if iv == "default" else f"-s {iv}"
        print(f"\nepoch/snapshot interval: {label}")
        print(f"{'configuration':<38}{'items/s':>10}{'words/s':>10}{'vs off':>8}  {'per round':<20}"
              f"{'flow CPU s':>11}{'broker CPU s':>13}  seconds")
        for c in configs:
            r = s["rows"][c]
            per = ", ".join(f"{x:.2f}" for x in r["vs_mp_off_rounds"])
            bad = "" if r["ok"] == r["runs"] else f"  ({r['runs'] - r['ok']} of {r['runs']} FAILED)"
            print(f"{LABELS[c]:<38}{r['items_per_s']:>10,.0f}{r['words_per_s']:>10,.0f}{r['vs_mp_off']:>8.2f}  "
                  f"{per:<20}{r['flow_cpu_s']:>11.1f}{r['broker_cpu_s']:>13.1f}  {r['seconds']}{bad}")
        rows = s["rows"]
        if "mp-eo" in rows and "mp-off" in rows:
            x = rows["mp-eo"]["vs_mp_off"]
            print(f"  target exactly-once >= 0.8 of recovery off: {x:.2f} -> {'met' if x >= 0.8 else 'NOT met'}")
        for key, what in (("mp-alo/bw-rec", "at-least-once + recovery vs Bytewax + recovery"),
                          ("mp-off/bw-off", "recovery off vs Bytewax without recovery")):
            p = s["pairs"][key]
            if p["rounds"]:
                print(f"  millpond {what}: {p['median']:.2f}x [{', '.join(f'{x:.2f}' for x in p['rounds'])}]"
                      f"{' (target: ahead -> ' + ('met' if p['median'] > 1 else 'NOT met') + ')' if key == 'mp-alo/bw-rec' else ''}")


# -- main ---------------------------------------------------------------------------


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, help="input messages (default 1,000,000; --quick 50,000)")
    ap.add_argument("--quick", action="store_true", help="50k messages, 1 round, interval 'default' only")
    ap.add_argument("--rounds", type=int, help="rounds, configurations interleaved in each (default 2)")
    ap.add_argument("--intervals", help="comma list of epoch/snapshot intervals: 'default' or seconds "
                                        "(default 'default,1'; --quick 'default')")
    ap.add_argument("--only", help=f"comma list of configurations (of {', '.join(CONFIGS)})")
    ap.add_argument("--no-bytewax", action="store_true")
    ap.add_argument("--bytewax-venv", type=Path, default=BW_VENV_DEFAULT)
    ap.add_argument("--calm-wait", type=float, default=60,
                    help="before each run wait up to this many seconds for a calm machine (default 60; 0: never)")
    ap.add_argument("--max-others", type=float, default=0.3,
                    help="calm: the rest of the machine (not the broker) uses fewer cores than this (default 0.3)")
    ap.add_argument("--workers", type=int, default=1, help="-w for every run (workers per process; default 1)")
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--logs", type=Path, help="keep the runs' logs here (default: a temp dir, removed)")
    ap.add_argument("--profile", type=Path, help="cProfile every millpond run into DIR/<run>.prof")
    ap.add_argument("--json", type=Path, help="also write every run and the summary here")
    args = ap.parse_args(argv)
    n = args.messages or (50_000 if args.quick else 1_000_000)
    rounds = args.rounds or (1 if args.quick else 2)
    intervals = (args.intervals or ("default" if args.quick else "default,1")).split(",")
    for iv in intervals:
        if iv != "default":
            float(iv)
    configs = [c for c in (args.only.split(",") if args.only else CONFIGS)]
    for c in configs:
        if c not in CONFIGS:
            ap.error(f"unknown configuration {c!r}")
    if args.no_bytewax:
        configs = [c for c in configs if not c.startswith("bw-")]

    bw_py: Optional[Path] = None
    if any(c.startswith("bw-") for c in configs):
        bw_py, why = ensure_bytewax(args.bytewax_venv)
        if bw_py is None:
            print(f"Bytewax unavailable, its configurations are skipped: {why}", flush=True)
            configs = [c for c in configs if not c.startswith("bw-")]

    t_gen = time.perf_counter()
    lines, expected = make_lines(n, args.seed)
    words = sum(expected.values())
    in_bytes = sum(len(x) for x in lines)
    out_bytes = sum(len(w) * c for w, c in expected.items()) + sum(
        sum(len(str(i)) for i in range(1, c + 1)) for c in expected.values())
    print(f"kafka_wordcount: {n:,} messages ({in_bytes / 1e6:.1f} MB of values), {words:,} words "
          f"({len(expected):,} distinct of {VOCAB:,}; output {words:,} records, {out_bytes / 1e6:.1f} MB of keys "
          f"and values); {PARTITIONS} partitions in and out; {rounds} round(s); intervals {intervals}; "
          f"configurations {configs}; generated in {time.perf_counter() - t_gen:.1f} s", flush=True)
    print(f"  nproc {os.cpu_count()}; load average {os.getloadavg()}; python {sys.version.split()[0]}", flush=True)

    results: List[Dict[str, Any]] = []
    out: Dict[str, Any] = {"messages": n, "workers": args.workers, "words": words, "distinct": len(expected), "rounds": rounds,
                           "intervals": intervals, "configs": configs, "load_start": os.getloadavg(),
                           "runs": results}
    git = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "pysrc", "tools/kafka"], cwd=REPO,
                           capture_output=True, text=True)
    out["git_head"] = git.stdout.strip()
    out["git_dirty"] = dirty.stdout.split("\n") if dirty.stdout.strip() else []
    print(f"  HEAD {out['git_head']}; uncommitted under pysrc/ and tools/kafka/: "
          f"{', '.join(x.split()[-1] for x in out['git_dirty'] if x.strip()) or 'none'}", flush=True)
    bmod = load_broker_module()
    broker = bmod.Broker(heap="1g")
    with tempfile.TemporaryDirectory(prefix="mp-bench-kafka-") as tmp_s:
        tmp = Path(tmp_s)
        try:
            broker.start()
            print(f"  broker {broker.bootstrap} started in {broker.start_seconds:.1f} s", flush=True)
            in_topic = "wc-in"
            create_topic(broker.bootstrap, in_topic)
            secs = fill(broker.bootstrap, in_topic, lines)
            print(f"  filled {in_topic}: {n:,} messages in {secs:.1f} s ({n / secs:,.0f}/s)", flush=True)
            out["fill_s"] = secs
            del lines
            bench = Bench(args, broker, bw_py, tmp, n, expected, in_topic)
            for iv in intervals:
                for rnd in range(1, rounds + 1):
                    for c in configs:
                        r = bench.run(c, iv, rnd)
                        results.append(r)
                        print(f"  [{iv:>7} r{rnd}] {c:<7} {r['seconds']:7.2f} s {r['items_per_s']:>10,.0f} items/s  "
                              f"cpu {r['flow_cpu_s']:5.1f} s, broker {r['broker_cpu_s']:4.1f} s, others "
                              f"{r['others_cores']:.2f} cores, load {r['load_at_start']:.2f}; "
                              f"{'OK' if r['ok'] else 'FAILED'}: {r['check']}", flush=True)
        finally:
            broker.stop()
    out["load_end"] = os.getloadavg()
    summary = summarize(results, intervals, configs)
    out["summary"] = summary
    print_summary(summary, configs)
    print(f"\nload average at start {out['load_start'][0]:.2f}, at end {out['load_end'][0]:.2f}")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    return 0 if all(r.get("ok") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
