"""A drain that comes while a worker takes a job: the worker is busy before it knows whether it may
start the job, in one step with the drain check, so a drain's answer never says idle for a worker
about to start a job; a drain that came first sends the job back to the front of its lane.

The state is driven directly, and the RQ and asyncio takers in this process on the real Redis,
with a drain landing at the latest moment a taker could miss it."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from redis import Redis
from rq import Queue

from lanepool_worker import Config, WorkerState
from lanepool_worker.aio import ListJob, run_worker
from lanepool_worker.rq import LaneSimpleWorker
from processes import value

SHARED = Config(("urgent", "batch"), "shared", "jobs", "jobs-shared-1", 1, None)


class DrainedAfterTheTake(WorkerState):
    """A worker state that the operator drains the first time the taker asks for the request
    count after a take handed it a job: the moment a check made before the busy mark would miss.
    Each drain's answer is kept, as the operator reads it."""

    def __init__(self, config: Config) -> None:
        super().__init__(config)
        self.took_a_job = False
        self.drained = False
        self.answers: list[str] = []

    def requests_seen(self) -> int:
        seen = super().requests_seen()
        if self.took_a_job and not self.drained:
            self.drain_and_answer()
        return seen

    def drain_and_answer(self) -> None:
        self.drained = True
        self.drain(30)
        self.answers.append(self.render().decode())

    def said_idle_while_draining(self) -> bool:
        return any(value(answer, "lanepool_worker_busy") == 0 for answer in self.answers)


def test_a_drain_before_the_busy_mark_sends_the_job_back_and_one_after_sees_it_busy():
    state = WorkerState(SHARED)
    seen = state.requests_seen()
    state.drain(30)  # lands between the take and the mark
    assert state.job_taken("batch", requests_seen=seen) is None
    assert value(state.render().decode(), "lanepool_worker_busy") == 0

    state = WorkerState(SHARED)
    in_hand = state.job_taken("batch", requests_seen=state.requests_seen())
    assert in_hand is not None
    state.drain(30)  # lands between the mark and the start
    answer = state.render().decode()
    assert value(answer, "lanepool_worker_busy", lane="batch") == 1
    assert value(answer, "lanepool_worker_draining") == 1
    state.job_handed_back(in_hand)
    answer = state.render().decode()
    assert value(answer, "lanepool_worker_busy") == 0
    # Given back unrun: no job time counted.
    assert value(answer, "lanepool_job_duration_seconds_count", lane="batch") == 0


def test_a_stand_in_during_the_take_sends_the_job_back():
    state = WorkerState(SHARED)
    seen = state.requests_seen()
    state.stand_in(["urgent"], 30)
    assert state.job_taken("batch", requests_seen=seen) is None


def drain_and_answer(state: WorkerState, both: threading.Barrier, answers: list[str]) -> None:
    """The operator's side of a race: a drain sent as the taker marks itself busy."""
    both.wait()
    state.drain(30)
    answers.append(state.render().decode())


def test_a_drain_racing_the_busy_mark_never_answers_idle_for_a_job_that_starts():
    for _ in range(300):
        state = WorkerState(SHARED)
        seen = state.requests_seen()
        both = threading.Barrier(2)
        answers: list[str] = []

        thread = threading.Thread(target=drain_and_answer, args=(state, both, answers))
        thread.start()
        both.wait()
        in_hand = state.job_taken("batch", requests_seen=seen)
        thread.join()
        said_busy = value(answers[0], "lanepool_worker_busy", lane="batch")
        assert (in_hand is not None) == (said_busy == 1), answers[0]


def test_the_asyncio_worker_never_runs_a_job_a_drain_answered_idle_for():
    state = DrainedAfterTheTake(SHARED)
    job = ListJob("batch", {"id": "j1"}, b'{"id": "j1"}')
    ran: list[tuple[str, bool]] = []
    given_back: list[ListJob] = []

    async def scenario() -> None:
        stop = asyncio.Event()
        handed_out = False

        async def take(lanes: Sequence[str], timeout: float) -> ListJob | None:
            nonlocal handed_out
            if handed_out:
                await asyncio.sleep(min(timeout, 0.01))
                return None
            handed_out = state.took_a_job = True
            return job

        async def run(job: ListJob) -> None:
            ran.append((job.payload["id"], state.said_idle_while_draining()))

        async def give_back(job: ListJob) -> None:
            given_back.append(job)

        asyncio.get_running_loop().call_later(0.3, stop.set)
        await run_worker(take, run, state, give_back=give_back, stop=stop)

    asyncio.run(scenario())
    assert state.drained
    # Either the job ran, busy before any drain answered, or it went back unrun.
    assert [said_idle for _, said_idle in ran] in ([], [False])
    assert len(ran) + len(given_back) == 1
    assert value(state.render().decode(), "lanepool_worker_busy") == 0


def queue_that_calls(after_take: Callable[[], None]) -> type[Queue]:
    class AfterTake(Queue):
        @classmethod
        def dequeue_any(cls, *args: Any, **kwargs: Any) -> Any:
            taken = super().dequeue_any(*args, **kwargs)
            if taken is not None:
                after_take()
            return taken

    return AfterTake


def rq_taker(redis: Redis, state: WorkerState, after_take: Callable[[], None]) -> LaneSimpleWorker:
    return LaneSimpleWorker(
        list(state.config.lanes),
        connection=redis,
        name="jobs-shared-1.test",
        state=state,
        queue_class=queue_that_calls(after_take),
    )


def test_the_rq_worker_is_busy_before_a_drain_can_answer_for_the_job_it_took(redis):
    state = DrainedAfterTheTake(SHARED)
    job = Queue("batch", connection=redis).enqueue("jobs.record")

    def took() -> None:
        state.took_a_job = True

    taken = rq_taker(redis, state, took)._take(burst=True)
    if not state.drained:
        state.drain_and_answer()  # the drain lands once the take is over
    assert not state.said_idle_while_draining()
    if taken is not None:
        assert taken[0].id == job.id
        assert value(state.answers[-1], "lanepool_worker_busy", lane="batch") == 1
    else:
        assert Queue("batch", connection=redis).job_ids == [job.id]


def test_the_rq_worker_gives_back_a_job_taken_as_a_drain_came(redis):
    state = WorkerState(SHARED)
    queue = Queue("batch", connection=redis)
    first, second = queue.enqueue("jobs.record"), queue.enqueue("jobs.record")

    taken = rq_taker(redis, state, lambda: state.drain(30))._take(burst=True)
    assert taken is None
    assert queue.job_ids == [first.id, second.id]  # back at the front, in order
    assert value(state.render().decode(), "lanepool_worker_busy") == 0
