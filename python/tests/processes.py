"""Real processes for the tests: redis-server, the package's console scripts as workers, the
pool's worker credential as the operator mounts it, and a raw HTTP client for the metrics port (as
the operator speaks to it: one request, then close).

Everything started here is stopped by its owner; nothing here imitates Redis, RQ or a worker.
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from lanepool_worker.config import CREDENTIAL_FILE_ENV

TESTS = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent  # the venv's console scripts


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def wait_until(what: str, done: Callable[[], object], within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while not done():
        assert time.monotonic() < deadline, f"no {what} in {within} s"
        time.sleep(0.01)


@dataclass
class RedisServer:
    port: int
    directory: Path
    durable: bool
    binary: str
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        args = [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", ""]
        args += ["--dir", str(self.directory), "--daemonize", "no"]
        if self.durable:
            args += ["--appendonly", "yes", "--appendfsync", "always"]
        else:
            args += ["--appendonly", "no"]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.directory
        )
        client = Redis(port=self.port)

        def answers() -> bool:
            try:
                return bool(client.ping())
            except RedisConnectionError:
                return False

        wait_until("redis-server answering", answers)
        client.close()

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            self.process.wait(timeout=10)
            self.process = None


def start_redis(binary: str, directory: Path, durable: bool = False) -> RedisServer:
    server = RedisServer(free_port(), directory, durable, binary)
    server.start()
    return server


@dataclass
class WorkerCredential:
    """The pool's worker credential as the operator mounts it: 64 hex characters in a file, which
    LANEPOOL_CREDENTIAL_FILE names."""

    path: Path
    token: str

    @property
    def env(self) -> dict[str, str]:
        return {CREDENTIAL_FILE_ENV: str(self.path)}

    @property
    def authorization(self) -> str:
        return f"Bearer {self.token}"

    def rotate(self) -> str:
        """A new token in the file, swapped in whole as the kubelet swaps a Secret's files (a
        reader never sees half of it); returns the old one."""
        old = self.token
        self.token = secrets.token_hex(32)
        _write_atomically(self.path, f"{self.token}\n")
        return old


def write_credential(directory: Path) -> WorkerCredential:
    credential = WorkerCredential(directory / "token", secrets.token_hex(32))
    _write_atomically(credential.path, f"{credential.token}\n")
    return credential


def _write_atomically(path: Path, text: str) -> None:
    fresh = path.with_name(f".{path.name}.new")
    fresh.write_text(text)
    os.replace(fresh, path)


@dataclass
class Worker:
    """A worker process with its stdout and stderr collected line by line; `post` carries the
    credential it was started with."""

    process: subprocess.Popen[str]
    metrics: tuple[str, int]
    name: str
    credential: WorkerCredential | None = None
    lines: list[str] = field(default_factory=list)

    def wait_for_line(self, what: str, found: Callable[[str], bool], within: float = 10) -> str:
        wait_until(what, lambda: any(found(line) for line in list(self.lines)), within)
        return next(line for line in list(self.lines) if found(line))

    def signal(self, signum: int = signal.SIGTERM) -> None:
        self.process.send_signal(signum)

    def wait_exit(self, within: float) -> int:
        return self.process.wait(timeout=within)

    def get(self, path: str = "/metrics") -> tuple[int, str]:
        return http(self.metrics, "GET", path)

    def post(self, path: str) -> tuple[int, str]:
        authorization = self.credential.authorization if self.credential is not None else None
        return http(self.metrics, "POST", path, authorization=authorization)

    def post_as(self, authorization: str | None, path: str) -> Answer:
        """A POST with this Authorization field (None: without one), answered in full."""
        return exchange(self.metrics, "POST", path, authorization=authorization)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


def start_worker(
    script: str,
    lanes: str,
    role: str = "shared",
    name: str = "jobs-shared-1",
    args: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    wait: bool = True,
    credential: WorkerCredential | None = None,
) -> Worker:
    """Starts `script` (a console script of the package) as the operator would: its lanes, role
    and pool in the environment, the metrics port on a free loopback port, and `credential`
    mounted (None: LANEPOOL_CREDENTIAL_FILE unset)."""
    metrics = ("127.0.0.1", free_port())
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "LANEPOOL_LANES": lanes,
        "LANEPOOL_ROLE": role,
        "LANEPOOL_POOL": "jobs",
        "LANEPOOL_METRICS_ADDR": f"{metrics[0]}:{metrics[1]}",
        "HOSTNAME": name,
        "PYTHONUNBUFFERED": "1",
        **(credential.env if credential is not None else {}),
        **(env or {}),
    }
    process = subprocess.Popen(
        [str(BIN / script), "--path", str(TESTS), *args],
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    worker = Worker(process, metrics, name, credential)

    def collect() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            worker.lines.append(line.rstrip("\n"))

    threading.Thread(target=collect, daemon=True).start()
    if wait:
        try:
            worker.wait_for_line("start line", lambda line: f"{role} worker of pool jobs" in line)
            wait_until("the metrics port", lambda: _answers(metrics))
        except BaseException:
            worker.stop()  # the test never gets it to stop
            raise
    return worker


def said_unmounted(name: str) -> str:
    """What a worker started as `name` with no credential mounted says at start (the RQ, asyncio
    and Celery workers alike)."""
    return (
        f"{name}: LANEPOOL_CREDENTIAL_FILE is not set: drain and stand-in requests are refused "
        "(no credential)"
    )


def _answers(addr: tuple[str, int]) -> bool:
    try:
        return http(addr, "GET", "/metrics")[0] == 200
    except OSError:
        return False


@dataclass(frozen=True)
class Answer:
    status: int
    headers: dict[str, str]  # by lowercase name
    body: str


def http(
    addr: tuple[str, int], method: str, path: str, authorization: str | None = None
) -> tuple[int, str]:
    """`exchange` without the headers: (status, body)."""
    answer = exchange(addr, method, path, authorization=authorization)
    return answer.status, answer.body


def exchange(
    addr: tuple[str, int],
    method: str,
    path: str,
    timeout: float = 5,
    authorization: str | None = None,
    fields: tuple[str, ...] = (),
) -> Answer:
    """One request with an Authorization field when given (and any other `fields`, whole
    lines), `Connection: close`, the whole answer read."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {addr[0]}", "Connection: close", *fields]
    if authorization is not None:
        lines.append(f"Authorization: {authorization}")
    with socket.create_connection(addr, timeout=timeout) as stream:
        stream.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        response = b""
        while piece := stream.recv(65536):
            response += piece
    head, _, body = response.partition(b"\r\n\r\n")
    status_line, *field_lines = head.decode("latin-1").split("\r\n") if head else [""]
    status = int(status_line.split()[1]) if status_line else 0
    headers = {}
    for line in field_lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(status, headers, body.decode())


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition: (name, sorted labels) → value."""
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(text: str, name: str, **labels: str) -> float | None:
    """One sample's value, None when absent."""
    return samples(text).get((name, tuple(sorted(labels.items()))))
