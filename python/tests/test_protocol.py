"""The metrics port as the operator meets it: every bad request of the Rust worker's table gets a
400 naming what is wrong and changes nothing, other paths a 404 with the usage, any GET the
gauges; bounded reads; and the drain and stand-in semantics of docs/worker-protocol.md."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import pytest

from lanepool_worker import Config, WorkerState, serve
from lanepool_worker.server import ServingThread
from processes import http, value

SHARED = Config(("urgent", "batch"), "shared", "jobs", "jobs-shared-1", 1, ("127.0.0.1", 0))


def serving_worker() -> Iterator[tuple[WorkerState, ServingThread]]:
    state = WorkerState(SHARED)
    serving = serve(state, ("127.0.0.1", 0))
    yield state, serving
    serving.close()  # up to half a second: the server's poll interval


worker = pytest.fixture(serving_worker)
# One for the refused drains, which change nothing.
refusing_worker = pytest.fixture(scope="module")(serving_worker)


def test_a_malformed_stand_in_is_refused_naming_what_is_wrong_and_changes_nothing(worker):
    state, serving = worker
    assert http(serving.address, "POST", "/stand-in?lanes=batch&seconds=60")[0] == 200
    seventeen = ",".join(f"lane-{i}" for i in range(1, 18))
    too_long = "a" * 64
    cases = [
        ("/stand-in", "seconds is missing"),
        ("/stand-in?lanes=urgent", "seconds is missing"),
        ("/stand-in?lanes=urgent&seconds=", 'seconds=""'),
        ("/stand-in?lanes=urgent&seconds=3601", 'seconds="3601"'),
        ("/stand-in?lanes=urgent&seconds=-1", 'seconds="-1"'),
        ("/stand-in?lanes=urgent&seconds=1.5", 'seconds="1.5"'),
        ("/stand-in?lanes=urgent&seconds=%331", 'seconds="%331"'),
        ("/stand-in?seconds=30", "lanes is missing"),
        ("/stand-in?lanes=&seconds=30", 'lane ""'),
        ("/stand-in?lanes=Urgent&seconds=30", 'lane "Urgent"'),
        ("/stand-in?lanes=-urgent&seconds=30", 'lane "-urgent"'),
        ("/stand-in?lanes=urgent-&seconds=30", 'lane "urgent-"'),
        ("/stand-in?lanes=urgent,,batch&seconds=30", 'lane ""'),
        (f"/stand-in?lanes={too_long}&seconds=30", too_long),
        (f"/stand-in?lanes={seventeen}&seconds=30", "17 lanes"),
        ("/stand-in?lanes=urgent,batch,urgent&seconds=30", 'lane "urgent" is named twice'),
        ("/stand-in?lanes=Urgent&seconds=0", 'lane "Urgent"'),
        ("/stand-in?lanes=urgent&seconds=30&seconds=0", "seconds is given twice"),
        ("/stand-in?lane=urgent&seconds=30", '"lane"'),
    ]
    for path, named in cases:
        status, body = http(serving.address, "POST", path)
        assert status == 400, f"{path}: {body}"
        assert body.startswith("POST /stand-in: "), body
        assert body.endswith("\n") and body.count("\n") == 1 and named in body, (path, body)
    status, usage = http(serving.address, "POST", "/stand-ins?lanes=urgent&seconds=30")
    assert status == 404
    assert "POST /stand-in?lanes=L1,L2&seconds=N" in usage and "POST /drain" in usage
    assert state.standing_in() == ("batch",)  # still as first asked
    assert state.lanes_to_take() == ["batch"]


@pytest.mark.parametrize(
    "path",
    ["/drain", "/drain?seconds=-1", "/drain?seconds=3601", "/drain?seconds=abc", "/drain?seconds=",
     "/drain?seconds=nan", "/drain?seconds=inf", "/drain?seconds=1_0", "/drain?seconds= 1",
     "/drain/x?seconds=1", "/drainage?seconds=1", "/drain?second=1"],
)  # fmt: skip
def test_a_bad_drain_is_refused_with_its_usage_and_changes_nothing(refusing_worker, path: str):
    state, serving = refusing_worker
    status, body = http(serving.address, "POST", path)
    assert status == 400
    assert body == "POST /drain?seconds=N (0 to 3600) stops taking jobs for N seconds\n"
    assert not state.draining()


def test_a_drain_takes_a_number_of_seconds_as_the_rust_worker_does(worker):
    state, serving = worker
    for seconds in ("1.5", "3600", "+2", "1e2", "5.", ".5"):
        status, body = http(serving.address, "POST", f"/drain?x=1&seconds={seconds}")
        assert status == 200, (seconds, body)
        assert value(body, "lanepool_worker_draining") == 1
        assert http(serving.address, "POST", "/drain?seconds=0")[0] == 200
        assert not state.draining()


def test_any_get_answers_the_gauges_and_other_posts_the_usage(worker):
    _, serving = worker
    for path in ("/metrics", "/", "/anything?x=1"):
        status, body = http(serving.address, "GET", path)
        assert status == 200 and value(body, "lanepool_worker_draining") == 0, path
    status, body = http(serving.address, "POST", "/metrics")
    assert status == 404 and body.startswith("POST /drain?seconds=N")


def test_the_longest_stand_in_and_form_encoded_commas_are_understood(worker):
    state, serving = worker
    lanes = ",".join(f"{'l' * 61}{i:02}" for i in range(16))
    status, body = http(serving.address, "POST", f"/stand-in?lanes={lanes}&seconds=3600")
    assert status == 200 and value(body, "lanepool_worker_standing_in") == 1
    assert state.lanes_to_take() == lanes.split(",")
    status, _ = http(serving.address, "POST", "/stand-in?lanes=batch%2Curgent&seconds=30")
    assert status == 200
    assert state.lanes_to_take() == ["batch", "urgent"]


def test_a_head_over_8_kib_or_cut_short_is_refused_and_a_slow_client_holds_nothing(worker):
    _, serving = worker
    status, body = http(serving.address, "GET", "/metrics?" + "x" * 9000)
    assert status == 400 and "longer than 8 KiB" in body
    # A client that sends half a line and stalls is answered 400 after 2 s; others meanwhile
    # are answered at once.
    with socket.create_connection(serving.address) as slow:
        slow.sendall(b"POST /drain?seco")
        started = time.monotonic()
        assert http(serving.address, "GET", "/metrics")[0] == 200
        assert time.monotonic() - started < 0.5
        slow.settimeout(5)
        answer = slow.recv(4096)
        assert answer.startswith(b"HTTP/1.1 400"), answer
        assert 1.5 < time.monotonic() - started < 3


def test_a_drain_ends_a_stand_in_and_calling_it_off_brings_back_the_own_lanes():
    state = WorkerState(SHARED)
    state.stand_in(["urgent"], 60)
    assert state.lanes_to_take() == ["urgent"]
    state.drain(60)
    assert state.lanes_to_take() == [] and state.standing_in() is None
    state.drain(0)
    assert state.lanes_to_take() == ["urgent", "batch"]


def test_a_stand_in_during_a_drain_waits_for_the_drain_to_end_and_replaces_the_last():
    state = WorkerState(SHARED)
    state.drain(60)
    state.stand_in(["batch", "urgent"], 30)
    assert state.lanes_to_take() == [] and state.draining()
    assert state.standing_in() == ("batch", "urgent")
    state.drain(0)
    assert state.lanes_to_take() == ["batch", "urgent"]
    state.stand_in(["urgent"], 30)
    assert state.lanes_to_take() == ["urgent"]
    state.stand_in([], 0)
    assert state.lanes_to_take() == ["urgent", "batch"] and state.standing_in() is None


def test_drains_and_stand_ins_lapse_by_themselves_and_the_lapse_ends_a_wait():
    state = WorkerState(SHARED)
    state.stand_in(["batch"], 1)
    began = time.monotonic()
    assert state.wait_for_change(5) is True  # the lapse, not the 5 s
    assert 0.9 < time.monotonic() - began < 1.5
    assert state.lanes_to_take() == ["urgent", "batch"]
    state.drain(1)
    assert state.lanes_to_take() == []
    time.sleep(1.05)
    assert state.lanes_to_take() == ["urgent", "batch"] and not state.draining()


def test_a_request_ends_a_wait_at_once_and_listeners_hear_it(worker):
    state, serving = worker
    heard: list[float] = []
    state.add_listener(lambda: heard.append(time.monotonic()))
    threading.Timer(0.2, http, (serving.address, "POST", "/stand-in?lanes=batch&seconds=9")).start()
    began = time.monotonic()
    assert state.wait_for_change(5) is True
    assert time.monotonic() - began < 1
    assert len(heard) == 1
    assert state.wait_for_change(0.1) is False
    http(serving.address, "POST", "/drain?seconds=bad")  # refused: nothing heard
    assert len(heard) == 1
