"""The convention a worker exports, for 0, 1 and several jobs in hand, read as the operator reads
it (src/controller/pods/text.rs): busy by lane or an unlabelled 0, the latest start of each
lane's jobs, draining, standing in, slots, and the job time and wait histograms by lane."""

from __future__ import annotations

import dataclasses
import time

from lanepool_worker import Config, WorkerState
from processes import samples, value

SHARED = Config(("urgent", "batch"), "shared", "jobs", "jobs-shared-1", 3, None)


def text_of(state: WorkerState) -> str:
    return state.render().decode()


def test_an_idle_worker_says_busy_0_without_a_lane_and_no_start_time():
    state = WorkerState(SHARED)
    text = text_of(state)
    assert "\nlanepool_worker_busy 0.0\n" in text
    assert "lanepool_worker_job_started_timestamp_seconds{" not in text
    assert value(text, "lanepool_worker_draining") == 0
    assert value(text, "lanepool_worker_standing_in") == 0
    assert value(text, "lanepool_worker_slots") == 3
    # Declared before any job: "no job finished yet" reads as 0 for the worker reads.
    assert "# TYPE lanepool_job_duration_seconds histogram" in text
    assert value(text, "lanepool_job_duration_seconds_count", lane="urgent") == 0


def test_one_job_in_hand_is_busy_1_with_its_lane_and_start():
    state = WorkerState(SHARED)
    before = time.time()
    job = state.job_started("batch", submitted_at=before - 2.0)
    text = text_of(state)
    assert value(text, "lanepool_worker_busy", lane="batch") == 1
    assert ("lanepool_worker_busy", ()) not in samples(text)
    started = value(text, "lanepool_worker_job_started_timestamp_seconds", lane="batch")
    assert started is not None and before - 0.01 <= started <= time.time()
    assert value(text, "lanepool_job_wait_seconds_count", lane="batch") == 1
    wait = value(text, "lanepool_job_wait_seconds_sum", lane="batch")
    assert wait is not None and 2.0 <= wait < 2.5

    time.sleep(0.05)
    state.job_finished(job)
    state.job_finished(job)  # twice: counted once
    text = text_of(state)
    assert value(text, "lanepool_worker_busy") == 0
    assert "lanepool_worker_job_started_timestamp_seconds{" not in text
    assert value(text, "lanepool_job_duration_seconds_count", lane="batch") == 1
    ran = value(text, "lanepool_job_duration_seconds_sum", lane="batch")
    assert ran is not None and 0.05 <= ran < 0.5


def test_several_jobs_in_hand_count_by_lane_with_the_latest_start():
    state = WorkerState(SHARED)
    first = state.job_started("urgent")
    time.sleep(0.01)
    second = state.job_started("urgent")
    state.job_started("batch")
    text = text_of(state)
    assert value(text, "lanepool_worker_busy", lane="urgent") == 2
    assert value(text, "lanepool_worker_busy", lane="batch") == 1
    started = value(text, "lanepool_worker_job_started_timestamp_seconds", lane="urgent")
    assert started == round(second.started_at, 3) > first.started_at
    state.job_finished(second)
    text = text_of(state)
    assert value(text, "lanepool_worker_busy", lane="urgent") == 1
    assert value(text, "lanepool_worker_job_started_timestamp_seconds", lane="urgent") == round(
        first.started_at, 3
    )


def test_draining_and_standing_in_show_in_the_answer():
    state = WorkerState(SHARED)

    def gauges() -> tuple[float | None, float | None]:
        text = text_of(state)
        return value(text, "lanepool_worker_standing_in"), value(text, "lanepool_worker_draining")

    state.stand_in(["urgent"], 30)
    assert gauges() == (1, 0)
    state.drain(30)
    assert gauges() == (0, 1)


def test_the_answer_says_the_credential_is_required_whatever_the_configuration():
    # The metrics port refuses every POST without the credential, even with no file configured:
    # the operator reads this line to tell such a worker from an image that predates it.
    for credential_file in (None, "/var/run/secrets/lanepool.dev/worker/token"):
        state = WorkerState(dataclasses.replace(SHARED, credential_file=credential_file))
        text = text_of(state)
        assert value(text, "lanepool_worker_credential_required") == 1
        assert "# TYPE lanepool_worker_credential_required gauge" in text
        assert [k for k in samples(text) if k[0] == "lanepool_worker_credential_required"] == [
            ("lanepool_worker_credential_required", ())
        ]
        assert "secrets" not in text


def test_the_answer_stays_within_what_the_operator_reads():
    state = WorkerState(Config(tuple(f"lane-{i}" for i in range(16)), "shared", "p", "w", 4, None))
    for i in range(16):
        state.job_finished(state.job_started(f"lane-{i}", time.time()))
    text = text_of(state)
    assert len(text.encode()) < 256 * 1024 and text.count("\n") < 4096
