"""Handlers the tests' `lanepool-redis-worker` runs (imported by the worker from this directory):
each job naps for its `seconds` and records its id in Redis list `done` once finished.

They must never depend on the test process: they run inside the worker.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from redis.asyncio import Redis


async def nap(job: dict[str, Any]) -> None:
    await asyncio.sleep(float(job.get("seconds", 0)))
    async with Redis.from_url(os.environ["LANEPOOL_REDIS_URL"]) as redis:
        await redis.rpush("done", job["id"])
