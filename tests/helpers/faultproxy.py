"""An HTTP/1.1 proxy on 127.0.0.1 in front of the test S3 server that can
misbehave on demand, to test what a run does when its S3 endpoint hangs,
answers slowly or fails.

Modes (``proxy.mode = ...``, switchable while a run is going; a change
applies from the next request, also on kept-alive connections):

- ``forward``: pass every request to the upstream server and its answer back;
- ``slow``: the same, but hold each answer back ``proxy.delay`` seconds;
- ``hang``: read the request, then never answer (the connection stays
  open until the client gives up or the proxy stops);
- ``error500``: answer every request with ``500 Internal Server Error``.

It parses just enough HTTP to find request and response boundaries
(``Content-Length``, chunked bodies, ``Expect: 100-continue``, HEAD), which
is what the AWS SDK's requests need. It runs in threads of the test
process: the runs it serves are subprocesses, so nothing here forks.
"""

from __future__ import annotations

import socket
import threading
import time
from typing import List, Optional, Tuple

MODES = ("forward", "slow", "hang", "error500")

_ERROR_BODY = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InternalError</Code>'
    b"<Message>injected by faultproxy</Message></Error>"
)


class _Closed(Exception):
    """The peer closed the connection."""


class _Reader:
    """Buffered reads of HTTP messages from a socket."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""

    def _fill(self) -> None:
        chunk = self.sock.recv(65536)
        if not chunk:
            raise _Closed()
        self.buf += chunk

    def until(self, sep: bytes) -> bytes:
        while sep not in self.buf:
            self._fill()
        i = self.buf.index(sep) + len(sep)
        out, self.buf = self.buf[:i], self.buf[i:]
        return out

    def exactly(self, n: int) -> bytes:
        while len(self.buf) < n:
            self._fill()
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def rest(self) -> bytes:
        """Everything until the peer closes."""
        try:
            while True:
                self._fill()
        except _Closed:
            pass
        out, self.buf = self.buf, b""
        return out

    def head(self) -> Tuple[bytes, List[Tuple[str, str]]]:
        """The start line and the headers of the next message."""
        raw = self.until(b"\r\n\r\n")
        lines = raw[:-4].split(b"\r\n")
        headers = []
        for line in lines[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            headers.append((name.strip(), value.strip()))
        return lines[0], headers

    def body(self, headers: List[Tuple[str, str]]) -> bytes:
        """The body, by ``Content-Length`` or chunked (re-framed as is)."""
        h = {k.lower(): v for k, v in headers}
        if "chunked" in h.get("transfer-encoding", "").lower():
            out = b""
            while True:
                size_line = self.until(b"\r\n")
                out += size_line
                size = int(size_line.split(b";")[0].strip(), 16)
                if size == 0:
                    # trailers, then an empty line
                    while True:
                        line = self.until(b"\r\n")
                        out += line
                        if line == b"\r\n":
                            return out
                out += self.exactly(size + 2)
        n = int(h.get("content-length", "0") or "0")
        return self.exactly(n)


def _render(start: bytes, headers: List[Tuple[str, str]]) -> bytes:
    return start + b"\r\n" + b"".join(f"{k}: {v}\r\n".encode("latin-1") for k, v in headers) + b"\r\n"


class FaultProxy:
    """The proxy: ``endpoint`` is its ``http://127.0.0.1:PORT``."""

    def __init__(self, upstream: str, mode: str = "forward", delay: float = 5.0) -> None:
        assert upstream.startswith("http://"), upstream
        host, _, port = upstream[len("http://"):].rstrip("/").partition(":")
        self.upstream = (host, int(port))
        self.mode = mode
        self.delay = delay
        self.requests: List[Tuple[float, str, str]] = []  # (time, mode, request line)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._socks: List[socket.socket] = []
        self._threads: List[threading.Thread] = []
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(64)
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._accepter = threading.Thread(target=self._accept_loop, name="faultproxy-accept", daemon=True)
        self._accepter.start()

    # --- observing ---------------------------------------------------------

    def seen(self, mode: Optional[str] = None, contains: str = "") -> int:
        """How many requests arrived (in ``mode``, with ``contains`` in the request line)."""
        with self._lock:
            return sum(1 for _t, m, line in self.requests if (mode is None or m == mode) and contains in line)

    def first_seen(self, mode: str) -> Optional[float]:
        """``time.monotonic()`` of the first request handled in ``mode``."""
        with self._lock:
            times = [t for t, m, _line in self.requests if m == mode]
        return times[0] if times else None

    def wait_for(self, mode: str, contains: str = "", count: int = 1, timeout: float = 20) -> None:
        """Block until ``count`` requests were handled in ``mode``; fail the test otherwise."""
        deadline = time.monotonic() + timeout
        while self.seen(mode, contains) < count:
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"the proxy saw {self.seen(mode, contains)} {mode} requests with {contains!r} "
                    f"within {timeout} s, not {count}; all: {self.requests[-10:]}"
                )
            time.sleep(0.01)

    # --- running -------------------------------------------------------------

    def close(self) -> None:
        """Stop accepting, drop every connection, join the threads."""
        self._stop.set()
        self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._accepter.join(timeout=5)
        for t in list(self._threads):
            t.join(timeout=5)

    def _track(self, s: socket.socket) -> None:
        with self._lock:
            self._socks.append(s)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                client, _addr = self._listener.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            client.settimeout(None)
            self._track(client)
            t = threading.Thread(target=self._serve, args=(client,), name="faultproxy-conn", daemon=True)
            self._threads.append(t)
            t.start()

    def _serve(self, client: socket.socket) -> None:
        upstream: Optional[socket.socket] = None
        up_reader: Optional[_Reader] = None
        reader = _Reader(client)
        try:
            while not self._stop.is_set():
                start, headers = reader.head()
                if any(k.lower() == "expect" and v.lower() == "100-continue" for k, v in headers):
                    client.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
                    headers = [(k, v) for k, v in headers if k.lower() != "expect"]
                body = reader.body(headers)
                mode = self.mode
                line = start.decode("latin-1")
                with self._lock:
                    self.requests.append((time.monotonic(), mode, line))
                if mode == "hang":
                    self._stop.wait()  # never answer; close() ends this
                    return
                if mode == "error500":
                    client.sendall(_render(b"HTTP/1.1 500 Internal Server Error", [
                        ("Content-Type", "application/xml"),
                        ("Content-Length", str(len(_ERROR_BODY))),
                    ]) + (b"" if line.startswith("HEAD ") else _ERROR_BODY))
                    continue
                if upstream is None:
                    upstream = socket.create_connection(self.upstream, timeout=60)
                    self._track(upstream)
                    up_reader = _Reader(upstream)
                assert up_reader is not None
                upstream.sendall(_render(start, headers) + body)
                rstart, rheaders = up_reader.head()
                while rstart.split(b" ")[1:2] == [b"100"]:
                    rstart, rheaders = up_reader.head()
                status = int(rstart.split(b" ")[1])
                no_body = line.startswith("HEAD ") or status in (204, 304)
                h = {k.lower() for k, _v in rheaders}
                if no_body:
                    rbody = b""
                elif "content-length" in h or "transfer-encoding" in h:
                    rbody = up_reader.body(rheaders)
                else:
                    rbody = up_reader.rest()
                if mode == "slow":
                    if self._stop.wait(self.delay):
                        return
                client.sendall(_render(rstart, rheaders) + rbody)
        except (_Closed, OSError, ValueError, IndexError):
            return
        finally:
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass

