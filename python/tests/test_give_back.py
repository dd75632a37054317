"""The asyncio worker's give-back of a job taken just as a request came, when Redis fails it: the
failure is that slot's alone (the other slots' jobs run to the end), the give-back is tried again
a few times, and a job that still cannot go back is named at error level, never dropped unsaid.

The worker runs in this process on the real Redis; the fault is injected in its give-back."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence

import pytest
from redis import Redis
from redis.exceptions import ConnectionError as RedisConnectionError

from lanepool_worker import Config, WorkerState
from lanepool_worker.aio import ListJob, RedisLists, run_worker
from processes import RedisServer

TWO_SLOTS = Config(("urgent", "batch"), "shared", "jobs", "jobs-shared-1", 2, None)


def list_job(job_id: str) -> ListJob:
    payload = {"id": job_id}
    return ListJob("batch", payload, json.dumps(payload).encode())


def run_with_failing_give_back(
    redis_server: RedisServer, failures: int
) -> tuple[list[str], list[str]]:
    """Two slots: one runs a 0.4 s job, the other takes a job just as a stand-in comes and gives
    it back while the first runs, the first `failures` give-backs failing as a lost Redis
    connection does. Returns the jobs that ran to the end and those that went back."""
    state = WorkerState(TWO_SLOTS)
    finished: list[str] = []
    given_back: list[str] = []

    async def scenario() -> None:
        queue = RedisLists(redis_server.url, TWO_SLOTS.slots)
        stop = asyncio.Event()
        handed_out = [list_job("long"), list_job("taken-as-a-request-came")]
        failed = 0

        async def take(lanes: Sequence[str], timeout: float) -> ListJob | None:
            if not handed_out:
                await asyncio.sleep(min(timeout, 0.01))
                return None
            job = handed_out.pop(0)
            if job.payload["id"] != "long":
                await asyncio.sleep(0.05)  # the long job is under way
                state.stand_in(["batch"], 30)
            return job

        async def run(job: ListJob) -> None:
            await asyncio.sleep(0.4)
            finished.append(job.payload["id"])

        async def give_back(job: ListJob) -> None:
            nonlocal failed
            if failed < failures:
                failed += 1
                raise RedisConnectionError("Connection closed by server.")
            await queue.give_back(job)
            given_back.append(job.payload["id"])

        asyncio.get_running_loop().call_later(0.6, stop.set)
        await run_worker(take, run, state, give_back=give_back, stop=stop)

    asyncio.run(scenario())
    return finished, given_back


def lane(redis: Redis, name: str) -> list[str]:
    return [json.loads(raw)["id"] for raw in redis.lrange(f"lanepool:lane:{name}", 0, -1)]


def test_a_give_back_that_fails_a_few_times_is_tried_again_and_the_other_slot_finishes(
    redis, redis_server
):
    redis.rpush("lanepool:lane:batch", json.dumps({"id": "queued"}))
    finished, given_back = run_with_failing_give_back(redis_server, failures=2)
    assert finished == ["long"]
    assert given_back == ["taken-as-a-request-came"]
    assert lane(redis, "batch") == ["taken-as-a-request-came", "queued"]  # back at the front


def test_a_give_back_that_keeps_failing_names_the_job_and_the_other_slot_finishes(
    redis, redis_server, caplog: pytest.LogCaptureFixture
):
    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="lanepool_worker"):
        finished, given_back = run_with_failing_give_back(redis_server, failures=1000)
    assert finished == ["long"]
    assert given_back == []
    lost = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(lost) == 1
    assert "taken-as-a-request-came" in lost[0].getMessage()
    assert "lane batch" in lost[0].getMessage()
    assert time.monotonic() - began < 5  # bounded: the slot does not wait on Redis for good
