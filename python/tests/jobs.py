"""RQ job functions the tests' workers run (imported by the worker from this directory): each
records, in Redis, which worker ran it from which lane, so the tests read the order jobs ran in.

They must never depend on the test process: they run inside `lanepool-rq-worker`.
"""

from __future__ import annotations

import os
import time

from rq import get_current_job


def record(seconds: float = 0.0) -> str:
    """Sleeps `seconds`; `ran:<worker>` gets the lane once done, `started:<worker>` at start."""
    job = get_current_job()
    assert job is not None
    worker = os.environ.get("HOSTNAME", "?")
    job.connection.rpush(f"started:{worker}", job.origin)
    time.sleep(seconds)
    job.connection.rpush(f"ran:{worker}", job.origin)
    return job.origin


def spin(seconds: float) -> int:
    """Holds the GIL for `seconds`: pure Python arithmetic, as a CPU-bound job does."""
    job = get_current_job()
    assert job is not None
    job.connection.rpush("spinning", job.id)
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += sum(i * i for i in range(1000))
    return n
