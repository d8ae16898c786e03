"""Test doubles for the engine's recovery hooks: a durable store kept in a
Python object across runs, and the run object the engine drives.

They follow the contract of ``millpond.engine.hooks.Run`` and
``millpond.state.StateStore`` closely enough to test the engine's side of
recovery (what is snapshotted when, what is restored) without the Go core.
"""

from __future__ import annotations

import pickle
from typing import Any, Callable, Dict, List, Optional, Tuple

from millpond.errors import SnapshotError
from millpond.keygroup import DEFAULT_KEY_GROUP_COUNT, worker_for_key

_DELETED = object()


class FakeDurable:
    """Committed state of a flow; survives across runs like a backup would."""

    def __init__(self) -> None:
        self.committed_epoch = 0
        self.executions = 0
        # (step, key) -> list of (epoch, pickled state or None for deletion)
        self.rows: Dict[Tuple[str, str], List[Tuple[int, Optional[bytes]]]] = {}
        self.events: List[Tuple[Any, ...]] = []
        #: (worker, epoch, last) of every close_epoch call, in order.
        self.closes: List[Tuple[int, int, bool]] = []
        #: Every run opened on this durable state, oldest first.
        self.runs: List["FakeRun"] = []

    def state_at(self, epoch: int) -> Dict[Tuple[str, str], Any]:
        out = {}
        for sk, rows in self.rows.items():
            older = [r for r in rows if r[0] <= epoch]
            if older and older[-1][1] is not None:
                out[sk] = pickle.loads(older[-1][1])
        return out


class FakeStore:
    """A per-worker store over a FakeDurable, with the StateStore methods."""

    def __init__(self, base: Dict[Tuple[str, str], Any], worker: int, count: int) -> None:
        self.base = {sk: v for sk, v in base.items() if worker_for_key(sk[1], count) == worker}
        self.builders: Dict[str, Callable[[Any], Any]] = {}
        self.live: Dict[Tuple[str, str], Any] = {}
        self.gone: set = set()
        self.touched: set = set()

    #: The fake keeps every key live (the real store's limit is tested on
    #: the real store).
    max_live_keys = None

    def register(self, step_id: str, builder: Callable[[Any], Any], *, evictable: bool = False) -> None:
        self.builders[step_id] = builder

    def prefetch(self, step_id: str, keys: Any) -> int:
        return 0

    def evict(self, epoch: int) -> int:
        return 0

    def ahead_packer(self, step_id: str) -> None:
        return None  # (packing ahead is tested on the real store)

    def live_count(self) -> int:
        return len(self.live)

    def evictable_count(self) -> int:
        return len(self.live)

    def peek(self, step_id: str, key: str) -> Any:
        sk = (step_id, key)
        if sk not in self.live:
            if sk in self.gone or sk not in self.base:
                return None
            self.live[sk] = self.builders[step_id](self.base[sk])
        return self.live[sk]

    def get(self, step_id: str, key: str) -> Any:
        obj = self.peek(step_id, key)
        if obj is not None:
            self.touched.add((step_id, key))
        return obj

    def get_or_build(self, step_id: str, key: str) -> Any:
        obj = self.get(step_id, key)
        if obj is None:
            obj = self.live[(step_id, key)] = self.builders[step_id](None)
            self.gone.discard((step_id, key))
            self.touched.add((step_id, key))
        return obj

    def set(self, step_id: str, key: str, obj: Any) -> None:
        self.live[(step_id, key)] = obj
        self.gone.discard((step_id, key))
        self.touched.add((step_id, key))

    def discard(self, step_id: str, key: str) -> None:
        self.live.pop((step_id, key), None)
        self.gone.add((step_id, key))
        self.touched.add((step_id, key))

    def hydrate_all(self, step_id: str, chunk_rows: int = 8192) -> int:
        built = 0
        for sk in self.base:
            if sk[0] == step_id and sk not in self.live and sk not in self.gone:
                self.live[sk] = self.builders[step_id](self.base[sk])
                built += 1
        return built

    def iter_keys(self, step_id: str) -> Any:
        return iter(self.keys(step_id))

    def keys(self, step_id: str) -> List[str]:
        ks = {k for (s, k) in self.live if s == step_id}
        ks |= {k for (s, k) in self.base if s == step_id and (s, k) not in self.gone}
        return sorted(ks)

    def snapshot(self, epoch: int) -> List[Tuple[str, str, Optional[bytes]]]:
        rows = []
        for sk in sorted(self.touched):
            obj = self.live.get(sk)
            try:
                blob = None if obj is None else pickle.dumps(obj.snapshot())
            except Exception as ex:  # as StateStore does
                raise SnapshotError(f"cannot snapshot state of step {sk[0]!r} key {sk[1]!r}") from ex
            rows.append((sk[0], sk[1], blob))
        self.touched.clear()
        return rows

    def close(self) -> None:
        pass


class FakeRun:
    """A recovery run for the engine, committing synchronously."""

    key_group_count = DEFAULT_KEY_GROUP_COUNT

    def __init__(self, durable: FakeDurable, worker_count: int) -> None:
        self.durable = durable
        self.worker_count = worker_count
        self.resume_epoch = durable.committed_epoch + 1
        self.execution = durable.executions
        durable.executions += 1
        base = durable.state_at(durable.committed_epoch)
        self.stores = [FakeStore(base, w, worker_count) for w in range(worker_count)]
        self.pending: Dict[int, Dict[int, list]] = {}
        # worker -> (epoch, rows) of its snapshot not yet closed
        self.snapshots: Dict[int, Tuple[int, list]] = {}
        self.finished: Optional[bool] = None
        durable.events.append(("open", self.execution, self.resume_epoch))
        durable.runs.append(self)

    def worker_store(self, worker_index: int) -> FakeStore:
        return self.stores[worker_index]

    def activation_done(self, worker_index: int, epoch: int) -> None:
        pass

    def snapshot_epoch(self, worker_index: int, epoch: int) -> None:
        self.durable.events.append(("snapshot", worker_index, epoch))
        self.snapshots[worker_index] = (epoch, self.stores[worker_index].snapshot(epoch))

    def close_epoch(self, worker_index: int, epoch: int, last: bool = False) -> None:
        self.durable.events.append(("close", worker_index, epoch))
        self.durable.closes.append((worker_index, epoch, last))
        snap = self.snapshots.pop(worker_index, None)
        assert snap is not None and snap[0] == epoch, f"worker {worker_index} closed epoch {epoch} without its snapshot"
        rows = snap[1]
        closed = self.pending.setdefault(epoch, {})
        closed[worker_index] = rows
        if len(closed) == self.worker_count:
            for ws in closed.values():
                for step, key, blob in ws:
                    self.durable.rows.setdefault((step, key), []).append((epoch, blob))
            self.durable.committed_epoch = epoch
            del self.pending[epoch]

    def committed_epoch(self) -> int:
        return self.durable.committed_epoch

    def finish(self, aborted: bool) -> None:
        self.finished = aborted
        self.durable.events.append(("finish", aborted))

    def close(self) -> None:
        pass


def install(monkeypatch: Any) -> None:
    """Make ``recovery_config=FakeDurable()`` use the fakes."""
    import millpond.engine.driver as driver

    real = driver.open_run

    def open_run(config: Any, flow_id: str, worker_count: int, *cluster: Any) -> Any:
        if isinstance(config, FakeDurable):
            return FakeRun(config, worker_count)
        return real(config, flow_id, worker_count, *cluster)

    monkeypatch.setattr(driver, "open_run", open_run)
