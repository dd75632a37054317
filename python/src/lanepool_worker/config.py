"""What the environment says a worker is: its lanes in order (and the queue of each that is not
named as its lane), its role, pool, name and job slots, and where the operator mounted the
credential its requests carry.

It only reads and validates (with the Rust example worker's texts, each naming the variable); it
must never guess a value the operator sets, so a hand-made template fails at start, not later.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass

LANES_ENV = "LANEPOOL_LANES"
ROLE_ENV = "LANEPOOL_ROLE"
POOL_ENV = "LANEPOOL_POOL"
SLOTS_ENV = "LANEPOOL_SLOTS"
METRICS_ADDR_ENV = "LANEPOOL_METRICS_ADDR"
CREDENTIAL_FILE_ENV = "LANEPOOL_CREDENTIAL_FILE"
QUEUES_ENV = "LANEPOOL_QUEUES"

DEFAULT_METRICS_ADDR = "0.0.0.0:9100"
MOST_SLOTS = 1024
# As the CRD's spec.lanes[].queue: at most 255 bytes of UTF-8, none of the separators of
# LANEPOOL_QUEUES (`,`, `=`), no space or control character.
MOST_QUEUE_BYTES = 255
_QUEUE_NAME = re.compile(r"[^,=\x00-\x20\x7f]+")

_SET_BY_THE_OPERATOR = "the operator sets LANEPOOL_LANES, LANEPOOL_ROLE and LANEPOOL_POOL"
_LANE_NAME = re.compile(r"[a-z0-9-]{1,40}")
_PORT = re.compile(r"[0-9]{1,5}")
_HOST = re.compile(r"[^\s\[\]]+")


class ConfigError(ValueError):
    """A variable is missing or malformed; the message names it."""


@dataclass(frozen=True)
class Config:
    """One worker process: the lanes it takes jobs from (first non-empty first) and who it is."""

    lanes: tuple[str, ...]
    role: str
    pool: str
    name: str
    slots: int
    metrics_addr: tuple[str, int] | None
    # The file holding the pool's worker credential; None: every drain and stand-in is refused.
    credential_file: str | None = None
    # (lane, queue) for each own lane whose queue is not its name (LANEPOOL_QUEUES).
    queues: tuple[tuple[str, str], ...] = ()

    def queue(self, lane: str) -> str:
        """The queue `lane`'s jobs are taken from: the lane's name unless LANEPOOL_QUEUES names
        another. What is taken, listened to and counted in Redis; metrics, drains and stand-ins
        name the lane."""
        return next((queue for named, queue in self.queues if named == lane), lane)

    def lane_of(self, queue: str) -> str:
        """The lane whose jobs `queue` holds; a queue of no lane is named as it is."""
        return next((lane for lane, named in self.queues if named == queue), queue)

    def lanes_shown(self, lanes: tuple[str, ...] | list[str] | None = None) -> str:
        """`urgent (queue high_priority),batch`, for the logs: each lane, with its queue where
        that is not its name."""
        return ",".join(
            lane if self.queue(lane) == lane else f"{lane} (queue {self.queue(lane)})"
            for lane in (self.lanes if lanes is None else lanes)
        )


def config_from_env(environ: Mapping[str, str] = os.environ) -> Config:
    """Reads `LANEPOOL_*` (and `HOSTNAME`, the Pod's name) or raises `ConfigError`."""
    lanes_text = _required(
        environ, LANES_ENV, "comma-separated lanes in preference order, such as urgent,batch"
    )
    lanes = tuple(lane.strip() for lane in lanes_text.split(","))
    bad = next((lane for lane in lanes if not _LANE_NAME.fullmatch(lane)), None)
    if bad is not None:
        raise ConfigError(
            f"{LANES_ENV}={debug_str(lanes_text)}: {debug_str(bad)} is not a lane name (lowercase "
            "letters, digits and '-'), expected comma-separated lanes such as urgent,batch"
        )
    role = _required(environ, ROLE_ENV, "reserved or shared")
    if role not in ("reserved", "shared"):
        raise ConfigError(f"{ROLE_ENV}={debug_str(role)}: expected reserved or shared")
    if role == "reserved" and len(lanes) != 1:
        # The operator gives a reserved worker exactly its lane; more means a hand-made template.
        raise ConfigError(
            f"{ROLE_ENV}=reserved takes exactly one lane, but {LANES_ENV}={debug_str(lanes_text)} "
            f"has {len(lanes)}"
        )
    pool = _required(environ, POOL_ENV, "the LanePool's name")
    slots = _slots(environ.get(SLOTS_ENV, "").strip())
    metrics_addr = _metrics_addr(environ.get(METRICS_ADDR_ENV, "").strip())
    name = environ.get("HOSTNAME", "").strip() or f"{pool}-{role}-{os.getpid()}"
    # Never a reason to refuse to start: a worker without it runs its jobs and refuses requests.
    credential_file = environ.get(CREDENTIAL_FILE_ENV, "").strip() or None
    queues = _queues(environ.get(QUEUES_ENV, ""), lanes)
    return Config(lanes, role, pool, name, slots, metrics_addr, credential_file, queues)


def why_off(environ: Mapping[str, str] = os.environ) -> str | None:
    """Why lanepool is off in this process ("LANEPOOL_LANES is not set" or "... is empty"), or
    None where LANEPOOL_LANES has a value, which `config_from_env` then reads and checks. The
    operator sets it, never empty, in every container of a pool. It alone decides: a producer's
    environment may hold LANEPOOL_POOL (its counter's pool) without being a worker."""
    value = environ.get(LANES_ENV)
    if value is None:
        return f"{LANES_ENV} is not set"
    if not value.strip():
        return f"{LANES_ENV} is empty"
    return None


def _required(environ: Mapping[str, str], name: str, expected: str) -> str:
    value = environ.get(name)
    if value is None:
        raise ConfigError(f"{name} is not set: expected {expected} ({_SET_BY_THE_OPERATOR})")
    if not value.strip():
        raise ConfigError(f"{name} is empty: expected {expected}")
    return value.strip()


def queues_from(text: str) -> dict[str, str]:
    """`lane=queue,…` as LANEPOOL_QUEUES carries it (unset or empty: every lane takes the queue
    of its name), lane → queue, or `ConfigError` naming the variable."""
    queues: dict[str, str] = {}
    if not text.strip():
        return queues
    for entry in text.split(","):
        lane, equals, queue = (part.strip(" ") for part in entry.partition("="))
        if (
            not equals
            or not _LANE_NAME.fullmatch(lane)
            or not _QUEUE_NAME.fullmatch(queue)
            or len(queue.encode()) > MOST_QUEUE_BYTES
        ):
            raise ConfigError(
                f"{QUEUES_ENV}={debug_str(text)}: {debug_str(entry)} is not lane=queue (a lane "
                f"name, then a queue of 1 to {MOST_QUEUE_BYTES} bytes without ',', '=', spaces "
                "or control characters), expected comma-separated pairs such as "
                "urgent=high_priority"
            )
        if lane in queues:
            raise ConfigError(f"{QUEUES_ENV}={debug_str(text)}: lane {debug_str(lane)} twice")
        queues[lane] = queue
    taken_by: dict[str, str] = {}
    for lane, queue in queues.items():
        if queue in taken_by:
            raise ConfigError(
                f"{QUEUES_ENV}={debug_str(text)}: lanes {taken_by[queue]} and {lane} take the "
                f"same queue {debug_str(queue)}"
            )
        taken_by[queue] = lane
    return queues


def _queues(text: str, lanes: tuple[str, ...]) -> tuple[tuple[str, str], ...]:
    """The worker's: only its own lanes. The operator sets no other, so another is a typo that
    would leave a lane on the wrong queue."""
    queues = queues_from(text)
    for lane in queues:
        if lane not in lanes:
            raise ConfigError(
                f"{QUEUES_ENV}={debug_str(text)}: {debug_str(lane)} is not one of "
                f"{LANES_ENV}={debug_str(','.join(lanes))}"
            )
    taken_by: dict[str, str] = {}
    for lane in lanes:
        queue = queues.get(lane, lane)
        if queue in taken_by:
            raise ConfigError(
                f"{QUEUES_ENV}={debug_str(text)}: lanes {taken_by[queue]} and {lane} take the "
                f"same queue {debug_str(queue)}"
            )
        taken_by[queue] = lane
    return tuple((lane, queues[lane]) for lane in lanes if lane in queues)


def _slots(text: str) -> int:
    if not text:
        return 1
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) <= MOST_SLOTS:
        raise ConfigError(
            f"{SLOTS_ENV}={debug_str(text)}: expected the number of jobs a worker runs at once, "
            f"a whole number from 1 to {MOST_SLOTS}"
        )
    return int(text)


def _metrics_addr(text: str) -> tuple[str, int] | None:
    """`host:port`, `[v6]:port`, or `off`; unset: every interface, port 9100."""
    if text == "off":
        return None
    text = text or DEFAULT_METRICS_ADDR
    host, _, port = text.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        host = ""  # an IPv6 address needs its brackets, or its last group reads as the port
    if not _HOST.fullmatch(host) or not _PORT.fullmatch(port) or int(port) > 65535:
        raise ConfigError(
            f"{METRICS_ADDR_ENV}={debug_str(text)}: expected HOST:PORT such as 0.0.0.0:9100 "
            "or [::1]:9100, or off"
        )
    return host, int(port)


def debug_str(text: str) -> str:
    """`text` quoted as Rust's `{:?}` quotes a string, so answers and errors read the same."""
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "\0": "\\0"}
    quoted = "".join(escapes.get(c, c if c.isprintable() else f"\\u{{{ord(c):x}}}") for c in text)
    return f'"{quoted}"'
