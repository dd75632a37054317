"""The metrics port as the operator meets it: every bad request of the Rust worker's table gets a
400 naming what is wrong and changes nothing, other paths a 404 with the usage, any GET the
gauges; bounded reads; the drain and stand-in semantics of docs/worker-protocol.md; and the
credential: a POST without it is a 401 before anything else, a stand-in for a lane not the
worker's own a 403, and the token file is read at every request."""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from lanepool_worker import Config, WorkerState, serve
from lanepool_worker.server import ServingThread
from processes import WorkerCredential, exchange, http, value, write_credential
from steering import (
    assert_open_metrics_without_the_token,
    assert_refused_every_request,
    assert_unauthorized,
)

SHARED = Config(("urgent", "batch"), "shared", "jobs", "jobs-shared-1", 1, ("127.0.0.1", 0))


@dataclass
class Port:
    """A worker's metrics port in this process, asked as the operator asks it: `post` carries
    `authorization`."""

    serving: ServingThread
    authorization: str | None

    @property
    def address(self) -> tuple[str, int]:
        return self.serving.address

    def post(self, path: str) -> tuple[int, str]:
        return http(self.address, "POST", path, authorization=self.authorization)


@contextmanager
def served(
    config: Config, credential_file: Path | None, authorization: str | None
) -> Iterator[tuple[WorkerState, Port]]:
    file = str(credential_file) if credential_file is not None else None
    state = WorkerState(dataclasses.replace(config, credential_file=file))
    serving = serve(state, ("127.0.0.1", 0))
    try:
        yield state, Port(serving, authorization)
    finally:
        serving.close()  # up to half a second: the server's poll interval


def serving_worker(credential: WorkerCredential) -> Iterator[tuple[WorkerState, Port]]:
    with served(SHARED, credential.path, credential.authorization) as worker:
        yield worker


worker = pytest.fixture(serving_worker)
# One for the refused drains, which change nothing.
refusing_worker = pytest.fixture(scope="module")(serving_worker)


def test_a_malformed_stand_in_is_refused_naming_what_is_wrong_and_changes_nothing(worker):
    state, serving = worker
    assert serving.post("/stand-in?lanes=batch&seconds=60")[0] == 200
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
        status, body = serving.post(path)
        assert status == 400, f"{path}: {body}"
        assert body.startswith("POST /stand-in: "), body
        assert body.endswith("\n") and body.count("\n") == 1 and named in body, (path, body)
    status, usage = serving.post("/stand-ins?lanes=urgent&seconds=30")
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
    status, body = serving.post(path)
    assert status == 400
    assert body == "POST /drain?seconds=N (0 to 3600) stops taking jobs for N seconds\n"
    assert not state.draining()


def test_a_drain_takes_a_number_of_seconds_as_the_rust_worker_does(worker):
    state, serving = worker
    for seconds in ("1.5", "3600", "+2", "1e2", "5.", ".5"):
        status, body = serving.post(f"/drain?x=1&seconds={seconds}")
        assert status == 200, (seconds, body)
        assert value(body, "lanepool_worker_draining") == 1
        assert serving.post("/drain?seconds=0")[0] == 200
        assert not state.draining()


def test_any_get_answers_the_gauges_and_other_posts_the_usage(worker):
    _, serving = worker
    for path in ("/metrics", "/", "/anything?x=1"):
        status, body = http(serving.address, "GET", path)
        assert status == 200 and value(body, "lanepool_worker_draining") == 0, path
    status, body = serving.post("/metrics")
    assert status == 404 and body.startswith("POST /drain?seconds=N")


def test_the_longest_stand_in_and_form_encoded_commas_are_understood(credential):
    # A stand-in names only the worker's own lanes: here sixteen of 63 bytes (more than
    # LANEPOOL_LANES takes), to reach the request's own limits.
    lanes = ",".join(f"{'l' * 61}{i:02}" for i in range(16))
    longest = Config((*lanes.split(","), "urgent", "batch"), "shared", "jobs", "w", 1, None)
    with served(longest, credential.path, credential.authorization) as (state, serving):
        status, body = serving.post(f"/stand-in?lanes={lanes}&seconds=3600")
        assert status == 200 and value(body, "lanepool_worker_standing_in") == 1
        assert state.lanes_to_take() == lanes.split(",")
        status, _ = serving.post("/stand-in?lanes=batch%2Curgent&seconds=30")
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
    threading.Timer(0.2, serving.post, ("/stand-in?lanes=batch&seconds=9",)).start()
    began = time.monotonic()
    assert state.wait_for_change(5) is True
    assert time.monotonic() - began < 1
    assert len(heard) == 1
    assert state.wait_for_change(0.1) is False
    serving.post("/drain?seconds=bad")  # refused: nothing heard
    assert len(heard) == 1
    http(serving.address, "POST", "/drain?seconds=60")  # without the credential: nothing heard
    assert len(heard) == 1


# -- the credential ----------------------------------------------------------------------------


def test_a_post_without_the_credential_is_a_401_before_its_path_is_read(
    refusing_worker, credential
):
    state, serving = refusing_worker
    heard: list[int] = []
    state.add_listener(lambda: heard.append(1))
    assert_refused_every_request(serving.address, credential)
    assert heard == [] and not state.draining() and state.standing_in() is None
    _, text = http(serving.address, "GET", "/metrics")
    assert value(text, "lanepool_worker_draining") == 0
    assert_open_metrics_without_the_token(text, credential)


def test_the_authorization_field_is_read_as_http_has_it(worker, credential):
    state, serving = worker
    token = credential.token
    # Field names and the scheme in any case, spaces around the token: all one credential.
    for authorization, fields in (
        (None, (f"authorization: Bearer {token}",)),
        (None, (f"AUTHORIZATION:Bearer {token}  ",)),
        (f"bearer {token}", ()),
        (f"BEARER   {token}", ()),
    ):
        answer = exchange(serving.address, "POST", "/drain?seconds=1", 5, authorization, fields)
        assert answer.status == 200, (authorization, fields, answer)
        assert value(answer.body, "lanepool_worker_draining") == 1
        answer = exchange(serving.address, "POST", "/drain?seconds=0", 5, authorization, fields)
        assert answer.status == 200
    assert not state.draining()
    # Two fields: which one to believe is a guess. The token in another field, or past 8 KiB
    # of head, is no credential; nor is one in the query.
    for authorization, fields, path in (
        (f"Bearer {token}", (f"Authorization: Bearer {token}",), "/drain?seconds=60"),
        (f"Bearer {token}", ("Authorization: Basic eDp5",), "/drain?seconds=60"),
        (None, (f"X-Authorization: Bearer {token}",), "/drain?seconds=60"),
        (None, (f"Proxy-Authorization: Bearer {token}",), "/drain?seconds=60"),
        (None, (), f"/drain?seconds=60&access_token={token}"),
        (f"Bearer {token}", ("X-Padding: " + "p" * 8200,), "/drain?seconds=60"),
    ):
        answer = exchange(serving.address, "POST", path, 5, authorization, fields)
        assert_unauthorized(answer, f"{fields} {authorization}")
    assert not state.draining()
    assert serving.post("/drain?seconds=0")[0] == 200, "still answering"


def test_a_worker_without_a_readable_credential_refuses_every_post(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lanepool_worker")
    token = "d" * 64
    missing = tmp_path / "missing"
    empty = tmp_path / "empty"
    empty.write_text(" \n\t\n")
    oversized = tmp_path / "oversized"
    oversized.write_text(token + " " * 4096)  # the token, then more than a credential holds
    directory = tmp_path / "directory"
    directory.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # opening it for reading could wait forever for a writer
    for credential_file in (None, missing, empty, oversized, directory, fifo, Path("/dev/zero")):
        with served(SHARED, credential_file, f"Bearer {token}") as (state, serving):
            began = time.monotonic()
            for path in ("/drain?seconds=60", "/stand-in?lanes=batch&seconds=60"):
                answer = exchange(serving.address, "POST", path, authorization=f"Bearer {token}")
                assert_unauthorized(answer, f"{credential_file}: {path}")
            assert time.monotonic() - began < 1, f"{credential_file}: slow"
            assert not state.draining() and state.standing_in() is None
            assert http(serving.address, "GET", "/metrics")[0] == 200
    # Said when a file goes wrong, naming it, once however many requests fail; never the token.
    said = [r.getMessage() for r in caplog.records if "the worker credential" in r.getMessage()]
    assert len(said) == 6, said
    assert all("drain and stand-in requests are refused" in line for line in said), said
    assert str(missing) in said[0] and "cannot be read" in said[0]
    assert "is empty" in said[1] and "longer than 4096 bytes" in said[2]
    assert "not a regular file" in said[3] and "not a regular file" in said[4]
    assert not any(token in record.getMessage() for record in caplog.records)


def test_the_token_file_is_read_at_every_request(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="lanepool_worker")
    credential = write_credential(tmp_path)
    with served(SHARED, credential.path, None) as (state, serving):
        # Written by hand, with a newline and spaces after it: the trailing whitespace is not
        # the token.
        credential.path.write_text(f"{credential.token}  \n\n")
        assert http(serving.address, "POST", "/drain?seconds=0",
                    authorization=credential.authorization)[0] == 200  # fmt: skip
        old = credential.rotate()
        answer = exchange(serving.address, "POST", "/drain?seconds=60",
                          authorization=f"Bearer {old}")  # fmt: skip
        assert_unauthorized(answer, "the token before the rotation")
        assert not state.draining()
        status, _ = http(serving.address, "POST", "/drain?seconds=60",
                         authorization=credential.authorization)  # fmt: skip
        assert status == 200 and state.draining()
        # Gone (the Secret deleted), then back: refused, then taken again, with no restart.
        credential.path.unlink()
        answer = exchange(serving.address, "POST", "/drain?seconds=0",
                          authorization=credential.authorization)  # fmt: skip
        assert_unauthorized(answer, "the file gone")
        assert state.draining()
        credential.rotate()
        status, _ = http(serving.address, "POST", "/drain?seconds=0",
                         authorization=credential.authorization)  # fmt: skip
        assert status == 200 and not state.draining()
    assert any("is readable again" in record.getMessage() for record in caplog.records)


def test_a_stand_in_for_a_lane_not_the_workers_own_is_a_403_naming_it(worker):
    state, serving = worker
    assert serving.post("/stand-in?lanes=batch&seconds=60")[0] == 200
    for path, lane in (
        ("/stand-in?lanes=reports&seconds=30", '"reports"'),
        ("/stand-in?lanes=urgent,reports&seconds=30", '"reports"'),
        ("/stand-in?lanes=other%2Curgent&seconds=30", '"other"'),
        ("/stand-in?lanes=reports&seconds=0", '"reports"'),
    ):
        status, body = serving.post(path)
        assert status == 403, (path, body)
        assert body == (
            f"POST /stand-in: lane {lane} is not one of this worker's lanes (urgent,batch)\n"
        ), body
    # The request's own checks come first: a malformed one is a 400, as before.
    status, body = serving.post("/stand-in?lanes=Reports&seconds=30")
    assert status == 400 and 'lane "Reports" is not a lane name' in body
    status, body = serving.post("/stand-in?lanes=reports&seconds=3601")
    assert status == 400 and 'seconds="3601"' in body
    assert state.standing_in() == ("batch",)  # still as first asked
    assert state.lanes_to_take() == ["batch"]
    # Its own lanes in any order and any part of them are the operator's stand-ins.
    assert serving.post("/stand-in?lanes=batch,urgent&seconds=30")[0] == 200
    assert state.lanes_to_take() == ["batch", "urgent"]
    assert serving.post("/stand-in?seconds=0")[0] == 200
    assert state.lanes_to_take() == ["urgent", "batch"]
