"""`lanepool-redis-worker` (the asyncio worker on Redis lists) as a real process: LANEPOOL_SLOTS
jobs at once and busy saying so, strict lane order, a drain that takes nothing new and ends at
once, SIGTERM finishing every job in hand while the rest stays queued, and only the pool's
credential steering it."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from redis import Redis

from lanepool_worker.producer import Producer
from processes import (
    RedisServer,
    Worker,
    WorkerCredential,
    said_unmounted,
    start_worker,
    value,
    wait_until,
)
from steering import assert_refused_and_unchanged, assert_refused_unmounted, assert_unauthorized


@pytest.fixture
def producer() -> Producer:
    return Producer(namespace="ns", pool="jobs", registry=None)


def redis_worker(
    redis_server: RedisServer, credential: WorkerCredential | None, queues: str | None = None
) -> Worker:
    """Three slots on lanes urgent,batch, `credential` mounted (None: the variable unset), and
    LANEPOOL_QUEUES=`queues` when given."""
    env = {"LANEPOOL_SLOTS": "3", "LANEPOOL_REDIS_URL": redis_server.url}
    if queues is not None:
        env["LANEPOOL_QUEUES"] = queues
    return start_worker(
        "lanepool-redis-worker",
        "urgent,batch",
        args=("--handler", "handlers:nap"),
        env=env,
        credential=credential,
    )


@pytest.fixture
def worker(
    redis_server: RedisServer, redis: Redis, credential: WorkerCredential
) -> Iterator[Worker]:
    started = redis_worker(redis_server, credential)
    yield started
    started.stop()


def done(redis: Redis) -> list[str]:
    return [job_id.decode() for job_id in redis.lrange("done", 0, -1)]


def test_three_slots_run_three_jobs_at_once_and_busy_says_3(redis, worker, producer):
    ids = [producer.submit_list(redis, "batch", {"seconds": 0.8})["id"] for _ in range(4)]
    wait_until("three jobs in hand", lambda: value(worker.get()[1], "lanepool_worker_busy",
                                                  lane="batch") == 3)  # fmt: skip
    assert redis.llen("lanepool:lane:batch") == 1
    _, text = worker.get()
    assert value(text, "lanepool_worker_slots") == 3
    assert value(text, "lanepool_worker_job_started_timestamp_seconds", lane="batch")
    wait_until("all four done", lambda: sorted(done(redis)) == sorted(ids))
    _, text = worker.get()
    assert value(text, "lanepool_worker_busy") == 0
    assert value(text, "lanepool_job_duration_seconds_count", lane="batch") == 4
    assert value(text, "lanepool_job_wait_seconds_count", lane="batch") == 4
    wait = value(text, "lanepool_job_wait_seconds_sum", lane="batch")
    assert wait is not None and wait >= 0.7  # the fourth waited for a slot


def test_lanes_are_taken_in_order_and_a_drain_takes_nothing_new_until_called_off(
    redis, worker, producer
):
    assert worker.post("/drain?seconds=60")[0] == 200
    batch = [producer.submit_list(redis, "batch", {"seconds": 0.05})["id"] for _ in range(3)]
    urgent = [producer.submit_list(redis, "urgent", {"seconds": 0.05})["id"] for _ in range(3)]
    time.sleep(0.5)
    assert done(redis) == []
    asked = time.monotonic()
    status, text = worker.post("/drain?seconds=0")
    assert status == 200 and value(text, "lanepool_worker_draining") == 0
    wait_until("all six done", lambda: len(done(redis)) == 6)
    assert time.monotonic() - asked < 0.6, "the drain's wait was not cut short"
    # Three slots took the three urgent jobs first, then the batch ones.
    assert set(done(redis)[:3]) == set(urgent) and set(done(redis)[3:]) == set(batch)


def test_a_lane_takes_the_list_of_the_queue_lanepool_queues_names_and_reports_the_lane(
    redis_server, redis, credential
):
    worker = redis_worker(redis_server, credential, queues="urgent=high_priority")
    # The producer knows the pool's queues as the workers do: it pushes to the lane's queue.
    producer = Producer("ns", "jobs", registry=None, queues={"urgent": "high_priority"})
    try:
        assert worker.post("/drain?seconds=60")[0] == 200
        batch = [producer.submit_list(redis, "batch", {"seconds": 0.05})["id"] for _ in range(3)]
        urgent = [producer.submit_list(redis, "urgent", {"seconds": 0.05})["id"] for _ in range(3)]
        assert redis.llen("lanepool:lane:high_priority") == 3
        assert redis.llen("lanepool:lane:urgent") == 0
        wait_until("the queue's depth as the lane's", lambda: value(worker.get()[1],
                   "lanepool_queue_depth", lane="urgent") == 3)  # fmt: skip
        assert worker.post("/drain?seconds=0")[0] == 200
        wait_until("all six done", lambda: len(done(redis)) == 6)
        assert set(done(redis)[:3]) == set(urgent) and set(done(redis)[3:]) == set(batch)
        _, text = worker.get()
        assert value(text, "lanepool_job_duration_seconds_count", lane="urgent") == 3
        assert "high_priority" not in text
    finally:
        worker.stop()


def test_sigterm_finishes_every_job_in_hand_and_leaves_the_rest_queued(redis, worker, producer):
    for _ in range(4):
        producer.submit_list(redis, "urgent", {"seconds": 1.0})
    wait_until("three jobs in hand", lambda: value(worker.get()[1], "lanepool_worker_busy",
                                                  lane="urgent") == 3)  # fmt: skip
    terminated = time.monotonic()
    worker.signal()
    assert worker.wait_exit(5) == 0
    assert time.monotonic() - terminated >= 0.5, "exited before its jobs could end"
    assert len(done(redis)) == 3
    assert redis.llen("lanepool:lane:urgent") == 1


# -- the credential ----------------------------------------------------------------------------


def test_a_post_without_the_credential_is_refused_and_the_worker_keeps_taking_jobs(
    redis, worker, producer, credential
):
    assert_refused_and_unchanged(worker.metrics, credential)
    job = producer.submit_list(redis, "batch", {"seconds": 0.0})["id"]
    wait_until("the job done", lambda: done(redis) == [job])
    # With it, as before.
    status, text = worker.post("/stand-in?lanes=batch&seconds=60")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    status, text = worker.post("/drain?seconds=60")
    assert status == 200 and value(text, "lanepool_worker_draining") == 1
    producer.submit_list(redis, "batch", {"seconds": 0.0})
    time.sleep(0.5)
    assert done(redis) == [job], "a drained worker took a job"


def test_a_worker_without_lanepool_credential_file_refuses_every_post_and_says_so(
    redis_server, redis, producer, credential
):
    unset = redis_worker(redis_server, None)
    try:
        said = said_unmounted("jobs-shared-1")
        unset.wait_for_line("the refusal said at start", lambda line: line.endswith(said))
        assert_refused_unmounted(unset.metrics, credential)
        job = producer.submit_list(redis, "urgent", {"seconds": 0.0})["id"]
        wait_until("the job done", lambda: done(redis) == [job])
    finally:
        unset.stop()


def test_a_rotated_token_counts_at_once_and_the_old_one_is_refused(
    redis_server, redis, own_credential
):
    started = redis_worker(redis_server, own_credential)
    try:
        assert started.post("/drain?seconds=0")[0] == 200
        old = own_credential.rotate()
        assert_unauthorized(started.post_as(f"Bearer {old}", "/drain?seconds=60"), "old token")
        status, text = started.post("/drain?seconds=60")
        assert status == 200 and value(text, "lanepool_worker_draining") == 1
    finally:
        started.stop()


def test_a_stand_in_for_a_lane_not_its_own_is_forbidden_and_changes_nothing(
    redis, worker, producer
):
    status, body = worker.post("/stand-in?lanes=urgent,reports&seconds=60")
    assert status == 403
    assert body == (
        'POST /stand-in: lane "reports" is not one of this worker\'s lanes (urgent,batch)\n'
    )
    reports = producer.submit_list(redis, "reports", {"seconds": 0.0})["id"]
    batch = producer.submit_list(redis, "batch", {"seconds": 0.0})["id"]
    wait_until("its own lane's job done", lambda: done(redis) == [batch])
    time.sleep(0.3)
    assert reports not in done(redis)
    assert redis.llen("lanepool:lane:reports") == 1
    _, text = worker.get()
    assert value(text, "lanepool_worker_standing_in") == 0
