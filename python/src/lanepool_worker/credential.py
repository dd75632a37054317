"""Who may steer this worker: the pool's worker credential, a bearer token the operator mounts as
a file (`LANEPOOL_CREDENTIAL_FILE`), which every drain and stand-in request must carry.

It must never admit a request when in doubt (no variable, no file, an empty or oversized one: every
POST is refused), never log or export the token, and never compare it in time that depends on it.
"""

from __future__ import annotations

import hmac
import logging
import os
import stat
import threading

from .config import CREDENTIAL_FILE_ENV

log = logging.getLogger("lanepool_worker")

# The operator's token is 64 hex characters; a file or a presented token longer than this is not
# the operator's, and reading no more than this keeps a huge file from exhausting the worker.
LONGEST_TOKEN = 4096
# What a 401 answers in WWW-Authenticate (RFC 6750).
CHALLENGE = 'Bearer realm="lanepool"'


class Credential:
    """The token in the file at `path`, read again at every request: the kubelet rewrites the file
    in place when the operator rotates the Secret, and the new token must count at once."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._problem_lock = threading.Lock()
        self._last_problem: str | None = None

    def admits(self, authorization: bytes | None) -> bool:
        """True only if `authorization` (an Authorization field's value) is `Bearer <token>` with
        the file's current token."""
        expected = self._current_token()
        presented = bearer_token(authorization)
        if expected is None or presented is None:
            return False
        return hmac.compare_digest(presented, expected)

    def _current_token(self) -> bytes | None:
        if self.path is None:
            return None  # said once at start, by the adapter (`unset_note`)
        try:
            token = read_token(self.path)
        except OSError as error:
            self._note_problem(f"cannot be read ({error.strerror or error})")
            return None
        except ValueError as error:
            self._note_problem(str(error))
            return None
        self._note_problem(None)
        return token

    def _note_problem(self, problem: str | None) -> None:
        # Logged when it starts or changes, not at every request: a flood of POSTs must not
        # become a flood of log lines. The text names the file, never what is in it.
        with self._problem_lock:
            if problem == self._last_problem:
                return
            self._last_problem = problem
        if problem is not None:
            log.warning(
                "the worker credential %s %s: drain and stand-in requests are refused",
                self.path,
                problem,
            )
        else:
            log.info("the worker credential %s is readable again", self.path)


def read_token(path: str) -> bytes:
    """The file's content without its trailing whitespace; ValueError when it is empty, longer
    than LONGEST_TOKEN or not a regular file (a FIFO would block the answer, a device never end)."""
    descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise ValueError("is not a regular file")
        content = b""
        while len(content) <= LONGEST_TOKEN:
            piece = os.read(descriptor, LONGEST_TOKEN + 1 - len(content))
            if not piece:
                break
            content += piece
    finally:
        os.close(descriptor)
    if len(content) > LONGEST_TOKEN:
        raise ValueError(f"is longer than {LONGEST_TOKEN} bytes")
    token = content.rstrip()
    if not token:
        raise ValueError("is empty")
    return token


def bearer_token(authorization: bytes | None) -> bytes | None:
    """`Bearer <token>` (the scheme in any case, as HTTP has it) → the token; None for anything
    else, a token longer than LONGEST_TOKEN included."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(b" ")
    token = token.lstrip(b" ")
    if scheme.lower() != b"bearer" or not token or len(token) > LONGEST_TOKEN:
        return None
    return token


def unset_note(name: str) -> str:
    """What a worker serving its metrics port without LANEPOOL_CREDENTIAL_FILE says once at
    start (the Rust example worker's words), so that a pool whose requests all fail shows why."""
    return (
        f"{name}: {CREDENTIAL_FILE_ENV} is not set: drain and stand-in requests are refused "
        "(no credential)"
    )
