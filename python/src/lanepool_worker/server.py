"""The metrics port: GET answers the convention, open to anyone; POST /drain and POST /stand-in
change the worker's state (validated by `protocol`), anything else posted is a 404 with the usage.
Every POST must first carry the pool's worker credential (`credential`), or it is a 401.

Every answer is bounded: a request head of at most 8 KiB read within 2 s, no body read, at most
64 connections served at once, never a redirect. It must never run a job or touch the queue, and
never tell a caller without the credential anything about its request.
"""

from __future__ import annotations

import socket
import socketserver
import sys
import threading
import time
from dataclasses import dataclass

from .credential import CHALLENGE, Credential
from .protocol import (
    DRAIN_USAGE,
    STAND_IN_USAGE,
    BadRequest,
    Drain,
    Forbidden,
    check_own_lanes,
    read_request,
)
from .state import WorkerState

LONGEST_REQUEST_HEAD = 8192
HEAD_DEADLINE = 2.0  # seconds for the whole head: a slow client cannot hold a thread longer
# The cap keeps a flood of connections from costing the worker memory and threads, but not from
# taking every slot (a slot is given before the credential is read, and each is held up to
# HEAD_DEADLINE): while it lasts, the operator's requests go unanswered, and the operator treats
# a worker it has not heard from as unknown and holds the shrink. Liveness only: it never cuts a
# job. The NetworkPolicy in the examples, which keeps other Pods off this port, prevents it.
MOST_CONNECTIONS = 64
# The operator waits 500 ms for an answer. A job that holds the GIL (CPU-bound Python in the
# same process, as RQ's SimpleWorker runs it) hands it over only every switch interval, 5 ms by
# default, and one answer needs the GIL back several times (accept, recv, render, send): GET p99
# 28-112 ms measured during such a job (python/bench.py), 19-27 ms at 1 ms. A job alone pays
# nothing more: the interval only matters while another thread waits for the GIL.
SWITCH_INTERVAL = 0.001
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


@dataclass(frozen=True)
class Answer:
    status: str
    body: bytes  # one line unless a 200 or the 404's usage
    headers: tuple[tuple[str, str], ...] = ()


# A request cut short could name fewer lanes than were sent.
CUT_SHORT = Answer("400 Bad Request", b"the request line is incomplete or longer than 8 KiB\n")
# The same answer whatever was wrong (no header, another scheme, a wrong token, no credential
# configured), in the Rust example worker's words: a 401 says nothing about why.
UNAUTHORIZED = Answer(
    "401 Unauthorized",
    b"this worker takes POST requests only with its pool's credential\n",
    (("WWW-Authenticate", CHALLENGE),),
)


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
    credential = Credential(state.config.credential_file)
    server = _Server((host, port), _Handler, family, state, credential)
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
        credential: Credential,
    ) -> None:
        self.address_family = family
        self.state = state
        self.credential = credential
        self._slots = threading.BoundedSemaphore(MOST_CONNECTIONS)
        super().__init__(addr, handler)

    def process_request(self, request: socket.socket, client_address: object) -> None:  # type: ignore[override]
        # Beyond MOST_CONNECTIONS at once, a connection is closed unanswered rather than given
        # a thread: a flood costs the worker nothing but refused connections (and, while it
        # lasts, the operator's answers: see MOST_CONNECTIONS).
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
            server = self.server
            request_line = line.decode("utf-8", "replace")
            reply = answer(server.state, server.credential, request_line, authorization(head))
        else:
            reply = CUT_SHORT
        try:
            self.request.sendall(response_bytes(reply))
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


def answer(
    state: WorkerState, credential: Credential, request_line: str, authorization: bytes | None
) -> Answer:
    """Acts on a request: a drain or stand-in request with the credential changes `state`, any
    other method only reads. `authorization`: the Authorization field's value, if one was sent."""
    method, target, *_ = [*request_line.split(), "", ""]
    if method != "POST":
        return Answer("200 OK", state.render())
    # Before the path or the query is read: a caller without the credential learns nothing,
    # not even whether its request was well-formed.
    if not credential.admits(authorization):
        return UNAUTHORIZED
    try:
        request = read_request(target)
        if request is None:
            return Answer("404 Not Found", f"{DRAIN_USAGE}{STAND_IN_USAGE}".encode())
        if isinstance(request, Drain):
            state.drain(request.seconds)
        else:
            check_own_lanes(request, state.config.lanes)
            state.stand_in(request.lanes, request.seconds)
    except BadRequest as refused:
        return Answer("400 Bad Request", f"{refused}\n".encode())
    except Forbidden as refused:
        return Answer("403 Forbidden", f"{refused}\n".encode())
    return Answer("200 OK", state.render())


def authorization(head: bytes) -> bytes | None:
    """The value of the head's one Authorization field; None when there is none, or more than
    one (which to believe is a guess). Only whole lines count: a head cut at 8 KiB may end in
    part of a field."""
    fields, ended, _ = head.partition(b"\r\n\r\n")
    lines = fields.split(b"\n")
    if not ended:
        lines = lines[:-1]
    found = [
        value
        for name, colon, value in (line.rstrip(b"\r").partition(b":") for line in lines[1:])
        if colon and name.lower() == b"authorization"
    ]
    return found[0].strip() if len(found) == 1 else None


def response_bytes(reply: Answer) -> bytes:
    content_type = CONTENT_TYPE if reply.status.startswith("200") else "text/plain; charset=utf-8"
    extra = "".join(f"{name}: {value}\r\n" for name, value in reply.headers)
    head = (
        f"HTTP/1.1 {reply.status}\r\nContent-Type: {content_type}\r\n{extra}"
        f"Content-Length: {len(reply.body)}\r\nConnection: close\r\n\r\n"
    )
    return head.encode() + reply.body
