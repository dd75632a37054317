"""The operator's requests at the metrics port, read from a request target: drain and stand-in,
and the rule that a stand-in names only the worker's own lanes.

Pure functions, the same rules and one-line reasons as the Rust example worker
(`examples/lane_worker.rs`); they must never act on a request they refuse, nor percent-decode
anything but the `%2C` commas a form-encoding client sends.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from .config import debug_str

# The longest drain a request can ask for: a drain the operator forgot must still end. A stand-in
# has the same limit.
LONGEST_DRAIN = 3600
MOST_STAND_IN_LANES = 16

DRAIN_USAGE = "POST /drain?seconds=N (0 to 3600) stops taking jobs for N seconds\n"
STAND_IN_USAGE = (
    "POST /stand-in?lanes=L1,L2&seconds=N (0 to 3600) takes jobs from these lanes, in this "
    "order, instead of its own for N seconds\n"
)
# What Rust's `str::parse::<f64>` takes: Python's `float()` also takes `1_0`, ` 1` and more.
_RUST_FLOAT = re.compile(
    r"[+-]?(?:[0-9]+\.?[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?|inf|infinity|nan)",
    re.IGNORECASE,
)
_DNS_LABEL = re.compile(r"[a-z0-9](?:[-a-z0-9]*[a-z0-9])?")
_WHOLE = re.compile(r"[0-9]+")


class BadRequest(ValueError):
    """A drain or stand-in request refused: `str()` of what `read_request` raises is the 400
    answer's one line (without its newline)."""


class Forbidden(ValueError):
    """A well-formed request this worker may not follow: `str()` is the 403 answer's one line."""


@dataclass(frozen=True)
class Drain:
    seconds: float  # 0: take jobs again at once


@dataclass(frozen=True)
class StandIn:
    lanes: tuple[str, ...]  # empty only with seconds 0
    seconds: int  # 0: the worker's own lanes again at once


def read_request(target: str) -> Drain | StandIn | None:
    """A POST's target → the request it makes; `None`: not a path of the protocol (a 404)."""
    if target.startswith("/drain"):
        return drain_request(target)
    path, _, query = target.partition("?")
    if path != "/stand-in":
        return None
    try:
        return stand_in_query(query)
    except BadRequest as refused:
        raise BadRequest(f"POST /stand-in: {refused}") from None


def drain_request(target: str) -> Drain:
    """`/drain?seconds=N`, N a number from 0 to 3600 (a fraction too, as the Rust worker)."""
    rest = target.removeprefix("/drain")
    pairs = rest[1:].split("&") if rest.startswith("?") else []
    text = next((p.removeprefix("seconds=") for p in pairs if p.startswith("seconds=")), None)
    if text is None or not _RUST_FLOAT.fullmatch(text):
        raise BadRequest(DRAIN_USAGE.rstrip("\n"))
    seconds = float(text)
    if not math.isfinite(seconds) or not 0 <= seconds <= LONGEST_DRAIN:
        raise BadRequest(DRAIN_USAGE.rstrip("\n"))
    return Drain(seconds)


def stand_in_query(query: str) -> StandIn:
    """`lanes=L1,L2&seconds=N`: N whole from 0 to 3600; lanes may be left out with 0."""
    expected = "expected lanes=L1,L2&seconds=N"
    given: dict[str, str] = {}
    for pair in filter(None, query.split("&")):
        name, _, value = pair.partition("=")
        if name not in ("lanes", "seconds"):
            raise BadRequest(f"unknown parameter {debug_str(name)}, {expected}")
        if name in given:
            raise BadRequest(f"{name} is given twice")
        given[name] = value
    seconds_text = given.get("seconds")
    if seconds_text is None:
        raise BadRequest(
            f"seconds is missing: a whole number from 0 to {LONGEST_DRAIN}, {expected}"
        )
    if not _WHOLE.fullmatch(seconds_text) or int(seconds_text) > LONGEST_DRAIN:
        raise BadRequest(
            f"seconds={debug_str(seconds_text)} is not a whole number from 0 to {LONGEST_DRAIN}"
        )
    seconds = int(seconds_text)
    if "lanes" in given:
        return StandIn(stand_in_lanes(given["lanes"]), seconds)
    if seconds == 0:
        return StandIn((), 0)
    raise BadRequest(
        f"lanes is missing: a stand-in for {seconds} s needs the lanes to take jobs from, "
        f"{expected}"
    )


def check_own_lanes(request: StandIn, own: Sequence[str]) -> None:
    """Raises `Forbidden` naming the first lane of `request` that is not one of `own` (the
    worker's LANEPOOL_LANES), so that not even a request with the credential can point the worker
    at a queue it was never given (another pool's lane on the same Redis). The operator only ever
    asks a shared worker to stand in for a lane it serves already."""
    foreign = next((lane for lane in request.lanes if lane not in own), None)
    if foreign is not None:
        raise Forbidden(
            f"POST /stand-in: lane {debug_str(foreign)} is not one of this worker's lanes "
            f"({','.join(own)})"
        )


def stand_in_lanes(text: str) -> tuple[str, ...]:
    """`L1,L2`: 1 to 16 distinct DNS labels."""
    # A client that form-encodes its query (reqwest's `.query()`) sends each comma as %2C.
    lanes = text.replace("%2C", ",").replace("%2c", ",").split(",")
    if len(lanes) > MOST_STAND_IN_LANES:
        raise BadRequest(f"lanes names {len(lanes)} lanes, at most {MOST_STAND_IN_LANES}")
    for i, lane in enumerate(lanes):
        if not is_dns_label(lane):
            raise BadRequest(
                f"lane {debug_str(lane)} is not a lane name (lowercase letters, digits and '-', "
                "a letter or digit first and last, at most 63 bytes)"
            )
        if lane in lanes[:i]:
            raise BadRequest(f"lane {debug_str(lane)} is named twice")
    return tuple(lanes)


def is_dns_label(lane: str) -> bool:
    """`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`, at most 63 bytes."""
    return len(lane.encode()) <= 63 and _DNS_LABEL.fullmatch(lane) is not None
