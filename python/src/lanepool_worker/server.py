"""The metrics port: GET answers the convention, POST /drain and POST /stand-in change the
worker's state (validated by `protocol`), anything else posted is a 404 with the usage.

Every answer is bounded: a request head of at most 8 KiB read within 2 s, no body read, at most
64 connections served at once, never a redirect. It must never run a job or touch the queue.
"""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
import time

from .protocol import DRAIN_USAGE, STAND_IN_USAGE, BadRequest, Drain, read_request
from .state import WorkerState

LONGEST_REQUEST_HEAD = 8192
HEAD_DEADLINE = 2.0  # seconds for the whole head: a slow client cannot hold a thread longer
MOST_CONNECTIONS = 64
# The operator waits 500 ms for an answer. A job that holds the GIL (CPU-bound Python in the
# same process, as RQ's SimpleWorker runs it) hands it over only every switch interval, 5 ms by
# default, and one answer needs the GIL back several times (accept, recv, render, send): GET p99
# 28-112 ms measured during such a job (python/bench.py), 19-27 ms at 1 ms. A job alone pays
# nothing more: the interval only matters while another thread waits for the GIL.
SWITCH_INTERVAL = 0.001
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class ServingThread:
    """The metrics server running on a daemon thread; `address` is the (host, port) bound."""

    def __init__(self, server: _Server) -> None:
        self._server = server
        host, port = server.server_address[:2]
        self.address: tuple[str, int] = (str(host), int(port))
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.5}, daemon=True,
            name="lanepool-metrics",
        )  # fmt: skip
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)


def serve(state: WorkerState, addr: tuple[str, int]) -> ServingThread:
    """Serves `state` at `addr` (port 0: any free port) until `close()` or the process ends."""
    if sys.getswitchinterval() > SWITCH_INTERVAL:
        sys.setswitchinterval(SWITCH_INTERVAL)
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    server = _Server((host, port), _Handler, family, state)
    return ServingThread(server)


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 64

    def __init__(
        self,
        addr: tuple[str, int],
        handler: type[socketserver.BaseRequestHandler],
        family: socket.AddressFamily,
        state: WorkerState,
    ) -> None:
        self.address_family = family
        self.state = state
        self._slots = threading.BoundedSemaphore(MOST_CONNECTIONS)
        super().__init__(addr, handler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        # Beyond MOST_CONNECTIONS at once, a connection is closed unanswered rather than given
        # a thread: a flood costs the worker nothing but refused connections.
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _Handler(socketserver.BaseRequestHandler):
    server: _Server
    request: socket.socket

    def handle(self) -> None:
        head = self._read_head()
        line, newline, _ = head.partition(b"\n")
        if newline:
            status, body = answer(self.server.state, line.decode("utf-8", "replace"))
        else:
            # A request cut short could name fewer lanes than were sent.
            status = "400 Bad Request"
            body = b"the request line is incomplete or longer than 8 KiB\n"
        content_type = CONTENT_TYPE if status.startswith("200") else "text/plain; charset=utf-8"
        response = (
            f"HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode()
        try:
            self.request.sendall(response + body)
        except OSError:
            return
        # A body the client sent is never read; what has already arrived is taken off the
        # socket, so closing it does not reset the connection before the answer is read.
        try:
            self.request.setblocking(False)
            self.request.recv(65536)
        except OSError:
            pass

    def _read_head(self) -> bytes:
        """The request head, which may come in pieces: up to 8 KiB, for at most 2 s."""
        head = b""
        deadline = time.monotonic() + HEAD_DEADLINE
        while len(head) < LONGEST_REQUEST_HEAD and b"\r\n\r\n" not in head:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            try:
                self.request.settimeout(left)
                piece = self.request.recv(LONGEST_REQUEST_HEAD - len(head))
            except OSError:
                break
            if not piece:
                break
            head += piece
        return head


def answer(state: WorkerState, request_line: str) -> tuple[str, bytes]:
    """Acts on a request line: a drain or stand-in request changes `state`, any other method
    only reads. Returns the status and the body."""
    method, target, *_ = [*request_line.split(), "", ""]
    if method == "POST":
        try:
            request = read_request(target)
        except BadRequest as refused:
            return "400 Bad Request", f"{refused}\n".encode()
        if request is None:
            return "404 Not Found", f"{DRAIN_USAGE}{STAND_IN_USAGE}".encode()
        if isinstance(request, Drain):
            state.drain(request.seconds)
        else:
            state.stand_in(request.lanes, request.seconds)
    return "200 OK", state.render()
