"""The demo's RQ jobs, with a ledger in Redis: every job id is added to `lanepool-demo:started`
when it starts and to `lanepool-demo:finished` when it ends (produce.py adds it to
`lanepool-demo:submitted`). After the workers stop, `python jobs.py --url URL` prints

    cut short = started - finished      (a job begun and never ended: a worker stopped mid-job)
    lost      = submitted - finished - still queued

The jobs only take time; they must never touch the ledger of another job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator

from redis import Redis
from rq import Queue, get_current_job

SUBMITTED = "lanepool-demo:submitted"
STARTED = "lanepool-demo:started"
FINISHED = "lanepool-demo:finished"


def sleep_job(seconds: float) -> None:
    """Waits `seconds`, as an I/O-bound job does."""
    with _ledger():
        time.sleep(seconds)


def cpu_job(seconds: float) -> None:
    """Computes for `seconds`, holding the GIL, as a CPU-bound job does."""
    with _ledger():
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(i * i for i in range(1000))


@contextlib.contextmanager
def _ledger() -> Iterator[None]:
    job = get_current_job()
    assert job is not None, "an RQ job function"
    job.connection.sadd(STARTED, job.id)
    yield  # an exception leaves the job started, never finished
    job.connection.sadd(FINISHED, job.id)


def ledger(redis: Redis, lanes: list[str]) -> dict[str, int]:
    """The demo's counts, once the workers have stopped."""
    submitted, started, finished = (
        {m.decode() for m in redis.smembers(key)} for key in (SUBMITTED, STARTED, FINISHED)
    )
    queued = {job_id for lane in lanes for job_id in Queue(lane, connection=redis).get_job_ids()}
    return {
        "submitted": len(submitted),
        "finished": len(finished),
        "still_queued": len(queued),
        "cut_short": len(started - finished),
        "lost": len(submitted - finished - queued),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Prints the demo's ledger as JSON.")
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--lanes", default="urgent,batch", help="comma-separated")
    args = parser.parse_args()
    print(json.dumps(ledger(Redis.from_url(args.url), args.lanes.split(","))))
