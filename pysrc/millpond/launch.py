"""Start a cluster of local processes: ``python -m millpond.run -p N ...``.

Each process is a new interpreter (``subprocess``, never ``fork``: a forked
child of a process that loaded the Go runtime hangs) running the same
command line with ``-i I -a ADDRESSES`` added, on ports of 127.0.0.1 the OS
chose free. The launcher forwards SIGINT and SIGTERM to the processes,
waits for them all, and exits with the first failure's status. When one
process fails the others stop by themselves (they lose a peer); any still
running after the peer timeout and a grace period are killed.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from typing import List, Optional, Sequence

__all__ = ["free_ports", "launch_local"]

logger = logging.getLogger("millpond")

# After the first process failed, the others get this long beyond the peer
# timeout to notice and stop on their own.
_GRACE_SECONDS = 5.0


def free_ports(n: int, host: str = "127.0.0.1") -> List[int]:
    """``n`` distinct ports on ``host`` that were free a moment ago."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def launch_local(
    argv: Sequence[str], processes: int, peer_timeout: Optional[float] = None, metrics_port: Optional[int] = None
) -> int:
    """Run ``python -m millpond.run ARGV`` as ``processes`` local processes
    of one cluster; return the exit status: 0, 128+N when the launcher got
    signal N (forwarded to every process), else the first failure's.
    ``peer_timeout`` defaults to ``MILLPOND_PEER_TIMEOUT`` (10 s).
    ``metrics_port`` N (``ARGV`` without ``--metrics-port``): process i
    serves its metrics on port N+i (every one on a free port for 0)."""
    if peer_timeout is None:
        try:
            peer_timeout = float(os.environ.get("MILLPOND_PEER_TIMEOUT", "") or 10.0)
        except ValueError:
            peer_timeout = 10.0
    addresses = ";".join(f"127.0.0.1:{p}" for p in free_ports(processes))
    procs: List[subprocess.Popen[bytes]] = []
    env = dict(os.environ)
    for name in ("MILLPOND_PROCESS_ID", "MILLPOND_ADDRESSES", "MILLPOND_PROCESSES"):
        env.pop(name, None)
    for i in range(processes):
        cmd = [sys.executable, "-m", "millpond.run", *argv, "-i", str(i), "-a", addresses]
        child_env = env
        if metrics_port is not None:
            child_env = dict(env, MILLPOND_METRICS_PORT=str(metrics_port + i if metrics_port else 0))
        procs.append(subprocess.Popen(cmd, env=child_env))
    logger.info("started %d processes on %s", processes, addresses)

    signalled: List[int] = []

    def forward(signum: int, frame: object) -> None:
        signalled.append(signum)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    old_int = signal.signal(signal.SIGINT, forward)
    old_term = signal.signal(signal.SIGTERM, forward)
    try:
        status = _wait_all(procs, peer_timeout)
        # Stopped on purpose: the processes may have ended in any order
        # (one seeing another leave first), but the cluster was signalled.
        return 128 + signalled[0] if signalled else status
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def _wait_all(procs: List["subprocess.Popen[bytes]"], peer_timeout: float) -> int:
    status = 0
    failed_at: Optional[float] = None
    while True:
        running = [p for p in procs if p.poll() is None]
        if status == 0 and any(p.returncode for p in procs):
            # A process killed by a signal is the cause; the others exit 1
            # within milliseconds of losing it, often before this loop
            # looks again. Polling everyone once more, after a failure was
            # seen, sees every death that came before it, and among the
            # failures seen together the signal wins.
            for p in procs:
                p.poll()
            codes = sorted((p.returncode for p in procs if p.returncode), key=lambda c: c > 0)
            if codes:
                status = codes[0] if codes[0] > 0 else 128 - codes[0]
                failed_at = time.monotonic()
        if not running:
            return status
        if failed_at is not None and time.monotonic() - failed_at > peer_timeout + _GRACE_SECONDS:
            for p in running:
                logger.warning("process %d did not stop after a peer failed; killing it", procs.index(p))
                p.kill()
        time.sleep(0.05)
