"""The demo's Celery app, with the same ledger in Redis as the RQ jobs (jobs.py): every task id is
added to `lanepool-demo:started` when it starts and to `lanepool-demo:finished` when it ends, and
`submit` adds it to `lanepool-demo:submitted`. After the workers stop, `python celery_app.py`
prints

    cut short = started - finished      (a job begun and never ended: a worker stopped mid-job)
    lost      = submitted - finished - still queued (in a lane, or unacked in Redis)

A worker is `celery -A celery_app worker` in this directory, with LANEPOOL_REDIS_URL and the
variables the operator sets; `configure(app)` does the rest. The tasks only take time; they must
never touch the ledger of another job.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections.abc import Iterator

from celery import Celery, Task
from lanepool_worker.celery import configure
from redis import Redis

SUBMITTED = "lanepool-demo:submitted"
STARTED = "lanepool-demo:started"
# When each task was sent (`lane time`) and started (Unix seconds), by id: the tests' waits for a
# producer that stamps nothing (a Celery message carries no time it was sent).
SENT_AT = "lanepool-demo:sent-at"
STARTED_AT = "lanepool-demo:started-at"
FINISHED = "lanepool-demo:finished"

REDIS_URL = os.environ.get("LANEPOOL_REDIS_URL", "redis://127.0.0.1:6379/0")

app = Celery("celery_app", broker=REDIS_URL)
configure(app)

_ledger_redis = Redis.from_url(REDIS_URL)  # redis-py reconnects in each forked child


@app.task(bind=True)
def sleep_job(self: Task, seconds: float) -> None:
    """Waits `seconds`, as an I/O-bound job does."""
    with _ledger(self.request.id):
        time.sleep(seconds)


@app.task(bind=True)
def cpu_job(self: Task, seconds: float) -> None:
    """Computes for `seconds`, holding the GIL, as a CPU-bound job does."""
    with _ledger(self.request.id):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            sum(i * i for i in range(1000))


@contextlib.contextmanager
def _ledger(task_id: str) -> Iterator[None]:
    _ledger_redis.sadd(STARTED, task_id)
    _ledger_redis.hset(STARTED_AT, task_id, repr(time.time()))
    yield  # an exception leaves the job started, never finished
    _ledger_redis.sadd(FINISHED, task_id)


def submit(redis: Redis, lane: str, seconds: float) -> str:
    """Sends `sleep_job(seconds)` to `lane` and adds its id to the ledger. The producer's
    `Producer.install_celery()` (lanepool_worker.producer) stamps and counts it."""
    sent = time.time()
    task_id = sleep_job.apply_async((seconds,), queue=lane).id
    redis.sadd(SUBMITTED, task_id)
    redis.hset(SENT_AT, task_id, f"{lane} {sent!r}")
    return str(task_id)


def ledger(redis: Redis, lanes: list[str]) -> dict[str, int]:
    """The demo's counts, once the workers have stopped."""
    submitted, started, finished = (
        {m.decode() for m in redis.smembers(key)} for key in (SUBMITTED, STARTED, FINISHED)
    )
    # Kombu keeps a lane's messages in the Redis list of its name, and a message a worker took
    # without acknowledging it in the hash `unacked` until its visibility timeout puts it back.
    messages = [m for lane in lanes for m in redis.lrange(lane, 0, -1)]
    queued = {json.loads(m)["headers"]["id"] for m in messages}
    queued |= {json.loads(m)[0]["headers"]["id"] for m in redis.hvals("unacked")}
    return {
        "submitted": len(submitted),
        "finished": len(finished),
        "still_queued": len(queued),
        "cut_short": len(started - finished),
        "lost": len(submitted - finished - queued),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Prints the demo's ledger as JSON.")
    parser.add_argument("--url", default=REDIS_URL)
    parser.add_argument("--lanes", default="urgent,batch", help="comma-separated")
    args = parser.parse_args()
    print(json.dumps(ledger(Redis.from_url(args.url), args.lanes.split(","))))
