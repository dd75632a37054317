"""`lanepool-rq-worker` as a real process on a real Redis, as the Rust worker's tests prove it
(tests/lane_worker.rs): urgent before batch, a reserved worker never takes batch, a drain stops
taking within one job, a stand-in takes the asked lanes between jobs and lapses, SIGTERM finishes
the job in hand, an unknown lane is only empty, a Redis restart loses no job, the metrics port
answers in time while a CPU-bound job runs, and only the pool's credential steers it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from redis import Redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.registry import FinishedJobRegistry

from processes import (
    RedisServer,
    Worker,
    WorkerCredential,
    said_unmounted,
    samples,
    start_worker,
    value,
    wait_until,
)
from steering import assert_refused_and_unchanged, assert_refused_unmounted, assert_unauthorized


class Workers(list[Worker]):
    """The test's workers, stopped after it, started with the pool's credential."""

    def __init__(self, credential: WorkerCredential) -> None:
        super().__init__()
        self.credential = credential


@pytest.fixture
def workers(credential: WorkerCredential) -> Iterator[Workers]:
    started = Workers(credential)
    yield started
    for worker in started:
        worker.stop()


def rq_worker(
    workers: Workers,
    redis: Redis,
    lanes: str,
    role: str = "shared",
    name: str = "jobs-shared-1",
    *args: str,
    **start: Any,
) -> Worker:
    """`start` goes to `start_worker`: `credential=None` starts it without one."""
    url = f"redis://127.0.0.1:{redis.connection_pool.connection_kwargs['port']}/0"
    start.setdefault("credential", workers.credential)
    worker = start_worker(
        "lanepool-rq-worker",
        lanes,
        role,
        name,
        ("--url", url, "--logging-level", "WARNING", *args),
        **start,
    )
    workers.append(worker)
    return worker


def submit(redis: Redis, lane: str, count: int, seconds: float = 0.0) -> list[Job]:
    queue = Queue(lane, connection=redis)
    return [queue.enqueue("jobs.record", seconds) for _ in range(count)]


def ran(redis: Redis, worker: Worker, what: str = "ran") -> list[str]:
    """The lanes of the jobs `worker` finished (or, `started`, began), in order."""
    return [lane.decode() for lane in redis.lrange(f"{what}:{worker.name}", 0, -1)]


def test_the_shared_worker_takes_urgent_before_batch_and_the_reserved_worker_never_batch(
    redis, workers
):
    submit(redis, "batch", 6, 0.05)
    submit(redis, "urgent", 40, 0.03)
    shared = rq_worker(workers, redis, "urgent,batch")
    wait_until("a first urgent job", lambda: ran(redis, shared))
    reserved = rq_worker(workers, redis, "urgent", "reserved", "jobs-urgent-reserved-1")
    wait_until("all 46 jobs", lambda: len(ran(redis, shared)) + len(ran(redis, reserved)) == 46)
    time.sleep(0.3)  # a job run twice would show now

    by_shared, by_reserved = ran(redis, shared), ran(redis, reserved)
    first_batch = by_shared.index("batch")
    assert first_batch > 0, by_shared
    assert set(by_shared[first_batch:]) == {"batch"}, f"urgent after batch: {by_shared}"
    assert by_shared.count("batch") == 6
    assert by_reserved and set(by_reserved) == {"urgent"}, by_reserved
    assert len(by_shared) + len(by_reserved) == 46

    # The convention, labelled by lane, counted in the worker that ran the jobs.
    _, text = shared.get()
    for lane in ("urgent", "batch"):
        assert value(text, "lanepool_job_duration_seconds_count", lane=lane) == by_shared.count(
            lane
        )
        assert value(text, "lanepool_job_wait_seconds_count", lane=lane) == by_shared.count(lane)
        assert value(text, "lanepool_queue_depth", lane=lane) == 0
    assert value(text, "lanepool_worker_busy") == 0
    _, text = reserved.get()
    assert value(text, "lanepool_job_duration_seconds_count", lane="urgent") == len(by_reserved)
    assert ("lanepool_job_duration_seconds_count", (("lane", "batch"),)) not in samples(text)


def test_a_drained_worker_finishes_its_job_takes_no_new_one_and_resumes(redis, workers):
    submit(redis, "batch", 4, 0.6)
    shared = rq_worker(workers, redis, "urgent,batch")
    wait_until("a batch job taken", lambda: ran(redis, shared, "started"))
    asked = time.monotonic()
    status, text = shared.post("/drain?seconds=2")
    assert status == 200
    assert value(text, "lanepool_worker_draining") == 1
    assert value(text, "lanepool_worker_busy", lane="batch") == 1
    wait_until("the job in hand done", lambda: ran(redis, shared))
    time.sleep(max(0.0, 1.6 - (time.monotonic() - asked)))
    _, text = shared.get()
    assert value(text, "lanepool_worker_busy") == 0
    assert value(text, "lanepool_worker_draining") == 1
    assert len(ran(redis, shared, "started")) == 1
    assert redis.llen("rq:queue:batch") == 3
    assert value(text, "lanepool_queue_depth", lane="batch") == 3
    # After 2 s without being stopped it takes jobs again.
    wait_until("a second job taken", lambda: len(ran(redis, shared, "started")) == 2)
    assert time.monotonic() - asked >= 1.9
    over = ": drain over: taking jobs again"
    shared.wait_for_line("drain over", lambda line: line.endswith(over))

    # seconds=0 ends a drain at once (the operator called the shrink off).
    assert shared.post("/drain?seconds=60")[0] == 200
    wait_until("the second job done", lambda: len(ran(redis, shared)) == 2)
    time.sleep(0.3)
    assert len(ran(redis, shared, "started")) == 2
    status, text = shared.post("/drain?seconds=0")
    assert value(text, "lanepool_worker_draining") == 0
    resumed = time.monotonic()
    wait_until("a third job taken", lambda: len(ran(redis, shared, "started")) == 3)
    assert time.monotonic() - resumed < 0.5, "the drain's wait was not cut short"
    assert shared.post("/drain?seconds=-1")[0] == 400
    assert shared.post("/other")[0] == 404


def test_a_worker_standing_in_is_woken_takes_the_asked_lanes_and_stops_when_called_off(
    redis, workers
):
    # A stand-in names only the worker's own lanes: a shared worker first asked to take urgent
    # alone waits on urgent as a reserved worker does.
    shared = rq_worker(workers, redis, "urgent,batch")
    assert shared.post("/stand-in?lanes=urgent&seconds=3600")[0] == 200
    submit(redis, "batch", 5, 0.3)
    time.sleep(0.4)  # inside its wait on urgent
    assert ran(redis, shared, "started") == []
    asked = time.monotonic()
    status, text = shared.post("/stand-in?lanes=batch&seconds=30")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    wait_until("a batch job taken", lambda: ran(redis, shared, "started"))
    assert time.monotonic() - asked < 0.5, "the wait on urgent was not cut short"
    shared.wait_for_line(
        "stand-in start",
        lambda line: line.endswith("jobs-shared-1: standing in: lanes batch (for 30 s)"),
    )
    wait_until("two batch jobs taken", lambda: len(ran(redis, shared, "started")) >= 2)

    # Called off by the stand-in before it: urgent alone again.
    status, text = shared.post("/stand-in?lanes=urgent&seconds=3600")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    urgent_alone = ": standing in: lanes urgent (for 3600 s)"
    wait_until(
        "the stand-in on urgent again",
        lambda: sum(line.endswith(urgent_alone) for line in list(shared.lines)) == 2,
    )
    batch_left = redis.llen("rq:queue:batch")
    assert batch_left > 0, "the backlog ran out during the stand-in"
    submit(redis, "urgent", 3, 0.02)
    wait_until("three urgent jobs", lambda: ran(redis, shared).count("urgent") == 3)
    time.sleep(0.3)  # a batch job taken by mistake would show now
    assert redis.llen("rq:queue:batch") == batch_left
    assert set(ran(redis, shared, "started")[-3:]) == {"urgent"}

    # seconds=0: its own lanes, the batch backlog too.
    status, text = shared.post("/stand-in?seconds=0")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 0
    over = shared.wait_for_line(
        "stand-in over", lambda line: line.endswith(": stand-in over: lanes urgent,batch again")
    )
    assert over
    wait_until("the batch backlog", lambda: redis.llen("rq:queue:batch") == 0)


def test_a_new_stand_in_replaces_the_last_and_lapses_by_itself(redis, workers):
    shared = rq_worker(workers, redis, "urgent,batch")
    assert shared.post("/stand-in?lanes=batch&seconds=60")[0] == 200
    replaced = time.monotonic()
    status, text = shared.post("/stand-in?lanes=urgent&seconds=2")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    submit(redis, "batch", 1, 0.05)
    submit(redis, "urgent", 1, 0.02)
    wait_until("the urgent job", lambda: ran(redis, shared))
    # The batch job waits for the stand-in to lapse; the lapse ends the wait on urgent.
    wait_until("the batch job", lambda: len(ran(redis, shared)) == 2)
    lapsed = time.monotonic() - replaced
    assert ran(redis, shared) == ["urgent", "batch"]
    assert 2 <= lapsed < 2.6, f"batch taken {lapsed:.2f} s after a 2 s stand-in began"
    _, text = shared.get()
    assert value(text, "lanepool_worker_standing_in") == 0


def test_sigterm_finishes_the_job_in_hand_and_an_idle_worker_exits_at_once(redis, workers):
    idle = rq_worker(workers, redis, "urgent", "reserved", "jobs-urgent-reserved-1")
    time.sleep(0.3)
    terminated = time.monotonic()
    idle.signal()
    assert idle.wait_exit(3) == 0
    assert time.monotonic() - terminated < 1.5

    (job,) = submit(redis, "batch", 1, 1.5)
    busy = rq_worker(workers, redis, "urgent,batch")
    wait_until("the job taken", lambda: ran(redis, busy, "started"))
    time.sleep(0.2)
    terminated = time.monotonic()
    busy.signal()
    assert busy.wait_exit(5) == 0
    assert time.monotonic() - terminated >= 1.0, "exited before its 1.5 s job could end"
    assert job.id in FinishedJobRegistry("batch", connection=redis)
    assert ran(redis, busy) == ["batch"]


def test_a_lane_the_queue_does_not_know_is_only_empty(redis, workers):
    shared = rq_worker(workers, redis, "urgent,never-used")
    status, text = shared.post("/stand-in?lanes=never-used&seconds=30")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    submit(redis, "urgent", 1)
    time.sleep(1.2)
    assert ran(redis, shared) == []
    status, text = shared.get()
    assert status == 200 and value(text, "lanepool_queue_depth", lane="never-used") == 0
    assert shared.post("/stand-in?seconds=0")[0] == 200
    wait_until("the urgent job", lambda: ran(redis, shared) == ["urgent"])
    assert shared.process.poll() is None


# A lane whose queue is not named as it (spec.lanes[].queue): the operator's LANEPOOL_QUEUES.
HIGH_PRIORITY = {"LANEPOOL_QUEUES": "urgent=high_priority"}


def test_a_lane_takes_the_rq_queue_lanepool_queues_names_and_reports_it_under_the_lane(
    redis, workers
):
    submit(redis, "batch", 4, 0.05)
    submit(redis, "high_priority", 5, 0.0)
    submit(redis, "urgent", 1)  # a queue of the lane's name, which no lane of the pool takes
    shared = rq_worker(workers, redis, "urgent,batch", env=HIGH_PRIORITY)
    shared.wait_for_line(
        "its lanes", lambda line: "lanes urgent (queue high_priority),batch" in line
    )
    wait_until("the nine jobs", lambda: len(ran(redis, shared)) == 9)
    time.sleep(0.3)
    # `ran` lists each job's RQ queue (its origin): the lane's jobs first, as the lane's.
    assert ran(redis, shared) == ["high_priority"] * 5 + ["batch"] * 4
    assert Queue("urgent", connection=redis).count == 1

    def depth(worker: Worker) -> float | None:
        return value(worker.get()[1], "lanepool_queue_depth", lane="urgent")

    # The depth read a second ago is kept for a second: high_priority's, 0 (urgent's is 1).
    wait_until("the lane's queue read empty", lambda: depth(shared) == 0)
    _, text = shared.get()
    assert value(text, "lanepool_job_duration_seconds_count", lane="urgent") == 5
    assert value(text, "lanepool_job_wait_seconds_count", lane="urgent") == 5
    assert not [labels for _, labels in samples(text) if ("lane", "high_priority") in labels]

    # A drain and a stand-in name the lane; the worker takes from its queue.
    reserved = rq_worker(
        workers, redis, "urgent", "reserved", "jobs-urgent-reserved-1", env=HIGH_PRIORITY
    )
    for worker in (reserved, shared):
        assert worker.post("/drain?seconds=60")[0] == 200
    submit(redis, "high_priority", 3)
    submit(redis, "batch", 1)
    wait_until("the queue's depth as the lane's", lambda: depth(reserved) == 3)
    status, text = shared.post("/stand-in?lanes=urgent&seconds=30")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    assert shared.post("/drain?seconds=0")[0] == 200
    wait_until("the lane's jobs taken by the stand-in", lambda: len(ran(redis, shared)) == 12)
    time.sleep(0.3)
    assert ran(redis, shared)[9:] == ["high_priority"] * 3
    assert (ran(redis, reserved), Queue("batch", connection=redis).count) == ([], 1)
    _, text = shared.get()
    assert value(text, "lanepool_job_duration_seconds_count", lane="urgent") == 8


def test_a_lost_take_of_a_lanes_queue_goes_back_to_that_queue(durable_redis, workers):
    redis = Redis(port=durable_redis.port)
    shared = rq_worker(workers, redis, "urgent,batch", env=HIGH_PRIORITY)
    job = _enqueued_and_popped(redis, "high_priority")
    _kill_while_taking(durable_redis, redis)
    wait_until("the lost job back and run", lambda: _all_finished(redis, [job]), within=20)
    assert ran(redis, shared) == ["high_priority"]
    shared.wait_for_line("the job given back", lambda line: f"job {job.id} of lane urgent" in line)


def test_a_redis_restart_loses_no_job_and_the_worker_takes_the_rest(durable_redis, workers):
    redis = Redis(port=durable_redis.port)
    jobs = submit(redis, "batch", 20, 0.05)
    shared = rq_worker(workers, redis, "urgent,batch")
    wait_until("5 jobs run", lambda: len(ran(redis, shared)) >= 5)
    durable_redis.kill()
    time.sleep(1.1)  # the depth read last is kept for a second
    began = time.monotonic()
    status, text = shared.get()
    assert status == 200 and time.monotonic() - began < 0.5
    assert value(text, "lanepool_queue_depth", lane="batch") is None  # absent, never 0
    durable_redis.start()
    wait_until("every job finished", lambda: _all_finished(redis, jobs), within=30)
    assert shared.process.poll() is None, "the worker quit instead of reconnecting"
    _, text = shared.get()
    assert value(text, "lanepool_queue_depth", lane="batch") == 0


def test_a_job_popped_by_a_take_whose_answer_was_lost_goes_back_to_its_lane(durable_redis, workers):
    # A Redis that pops a job and dies before its answer arrives leaves the job queued in no
    # list. Here the pop is made by hand while the worker waits in its take; then Redis dies
    # and comes back, cutting that take short.
    redis = Redis(port=durable_redis.port)
    shared = rq_worker(workers, redis, "urgent,batch")
    job = _enqueued_and_popped(redis, "batch")
    _kill_while_taking(durable_redis, redis)
    wait_until("the lost job back and run", lambda: _all_finished(redis, [job]), within=20)
    assert ran(redis, shared) == ["batch"]
    shared.wait_for_line("the job given back", lambda line: f"job {job.id} of lane batch" in line)


def test_two_workers_whose_takes_were_cut_give_a_lost_job_back_once(durable_redis, workers):
    redis = Redis(port=durable_redis.port)
    first = rq_worker(workers, redis, "urgent,batch", "shared", "jobs-shared-1")
    second = rq_worker(workers, redis, "urgent,batch", "shared", "jobs-shared-2")
    job = _enqueued_and_popped(redis, "batch")
    wait_until(
        "both workers waiting in their take",
        lambda: sum(c.get("cmd") == "blpop" for c in redis.client_list()) >= 2,
    )
    _kill_while_taking(durable_redis, redis)
    wait_until("the lost job back and run", lambda: _all_finished(redis, [job]), within=20)
    time.sleep(1.0)
    assert sorted(ran(redis, first) + ran(redis, second)) == ["batch"], "run once"
    given_back = [
        line
        for worker in (first, second)
        for line in list(worker.lines)
        if "is back at the head of its lane" in line
    ]
    assert len(given_back) == 1, given_back


def test_a_job_another_worker_is_about_to_start_is_not_given_back(durable_redis, workers):
    # Popped and not yet started, as by a worker between its take and the job's start: a job
    # that is started within the grace stays where it is.
    redis = Redis(port=durable_redis.port)
    shared = rq_worker(workers, redis, "urgent,batch")
    job = _enqueued_and_popped(redis, "batch")
    _kill_while_taking(durable_redis, redis)
    shared.wait_for_line("the job seen lost", lambda line: job.id in line and "unless" in line)
    # "Another worker" starts it now, within the grace.
    job.set_status(JobStatus.STARTED)
    time.sleep(6.0)
    assert redis.llen("rq:queue:batch") == 0, "given back although started"
    assert ran(redis, shared, "started") == []
    assert not any("is back at the head of its lane" in line for line in list(shared.lines))


def _enqueued_and_popped(redis: Redis, lane: str) -> Job:
    """A job enqueued and popped at once (one transaction: no worker takes it in between), as a
    take whose answer was lost leaves it: queued, in no list."""
    queue = Queue(lane, connection=redis)
    with redis.pipeline() as pipe:
        job = queue.enqueue("jobs.record", 0.0, pipeline=pipe)
        pipe.lpop(queue.key)
        popped = pipe.execute()[-1]
    assert popped is not None and popped.decode() == job.id
    return job


def _kill_while_taking(server: RedisServer, redis: Redis) -> None:
    """Kills Redis while the worker waits in its take (a blocking pop), and starts it again."""
    wait_until(
        "the worker waiting in its take",
        lambda: any(c.get("cmd") == "blpop" for c in redis.client_list()),
    )
    server.kill()
    time.sleep(0.5)
    server.start()


def _all_finished(redis: Redis, jobs: list[Job]) -> bool:
    try:
        return all(job.get_status() == JobStatus.FINISHED for job in jobs)
    except Exception:
        return False


def test_the_metrics_port_answers_in_time_while_a_cpu_bound_job_runs(redis, workers):
    shared = rq_worker(workers, redis, "urgent,batch")
    Queue("batch", connection=redis).enqueue("jobs.spin", 2.0)
    wait_until("the job spinning", lambda: redis.llen("spinning"))
    slowest = 0.0
    for _ in range(20):
        began = time.monotonic()
        status, text = shared.get()
        slowest = max(slowest, time.monotonic() - began)
        assert status == 200 and value(text, "lanepool_worker_busy", lane="batch") == 1
        time.sleep(0.02)
    began = time.monotonic()
    status, text = shared.post("/drain?seconds=30")
    slowest = max(slowest, time.monotonic() - began)
    assert status == 200
    assert slowest < 0.5, f"an answer took {slowest * 1000:.0f} ms"


def test_the_fork_worker_counts_in_the_parent(redis, workers):
    submit(redis, "urgent", 3, 0.3)
    forking = rq_worker(workers, redis, "urgent", "reserved", "jobs-urgent-reserved-1",
                        "--worker-class", "fork")  # fmt: skip
    wait_until("a job running", lambda: ran(redis, forking, "started"))
    _, text = forking.get()
    assert value(text, "lanepool_worker_busy", lane="urgent") == 1
    wait_until("three jobs", lambda: len(ran(redis, forking)) == 3)
    wait_until(
        "three counted",
        lambda: value(forking.get()[1], "lanepool_job_duration_seconds_count", lane="urgent") == 3,
        within=2,
    )


# -- the credential ----------------------------------------------------------------------------


def test_a_post_without_the_credential_is_refused_and_the_worker_keeps_taking_jobs(
    redis, workers, credential
):
    shared = rq_worker(workers, redis, "urgent,batch")
    assert_refused_and_unchanged(shared.metrics, credential)
    submit(redis, "batch", 1)
    wait_until("the job run", lambda: ran(redis, shared) == ["batch"])
    # With it, as before.
    status, text = shared.post("/stand-in?lanes=batch&seconds=60")
    assert status == 200 and value(text, "lanepool_worker_standing_in") == 1
    status, text = shared.post("/drain?seconds=60")
    assert status == 200 and value(text, "lanepool_worker_draining") == 1
    submit(redis, "batch", 1)
    time.sleep(0.5)
    assert ran(redis, shared, "started") == ["batch"], "a drained worker took a job"


def test_a_worker_without_lanepool_credential_file_refuses_every_post_and_says_so(
    redis, workers, credential
):
    unset = rq_worker(workers, redis, "urgent,batch", credential=None)
    said = said_unmounted("jobs-shared-1")
    unset.wait_for_line("the refusal said at start", lambda line: line.endswith(said))
    assert_refused_unmounted(unset.metrics, credential)
    submit(redis, "urgent", 1)
    wait_until("the job run", lambda: ran(redis, unset) == ["urgent"])


def test_a_rotated_token_counts_at_once_and_the_old_one_is_refused(redis, workers, own_credential):
    shared = rq_worker(workers, redis, "urgent,batch", credential=own_credential)
    assert shared.post("/drain?seconds=0")[0] == 200
    old = own_credential.rotate()
    assert_unauthorized(shared.post_as(f"Bearer {old}", "/drain?seconds=60"), "the old token")
    status, text = shared.post("/drain?seconds=60")
    assert status == 200 and value(text, "lanepool_worker_draining") == 1


def test_a_stand_in_for_a_lane_not_its_own_is_forbidden_and_changes_nothing(redis, workers):
    reserved = rq_worker(workers, redis, "urgent", "reserved", "jobs-urgent-reserved-1")
    submit(redis, "batch", 1)
    status, body = reserved.post("/stand-in?lanes=batch&seconds=60")
    assert status == 403
    assert body == 'POST /stand-in: lane "batch" is not one of this worker\'s lanes (urgent)\n'
    submit(redis, "urgent", 1)
    wait_until("its own lane's job", lambda: ran(redis, reserved) == ["urgent"])
    time.sleep(0.3)
    assert ran(redis, reserved, "started") == ["urgent"]
    assert redis.llen("rq:queue:batch") == 1
    _, text = reserved.get()
    assert value(text, "lanepool_worker_standing_in") == 0
