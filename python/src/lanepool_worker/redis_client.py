"""The two kinds of Redis client a worker needs: one that rides out a Redis restart (the take,
RQ's bookkeeping, the jobs), and one that never makes an HTTP answer wait (depth, unblocking).

It must never retry what runs while the operator waits for an answer.
"""

from __future__ import annotations

from redis import ConnectionPool, Redis
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.retry import Retry

REDIS_URL_ENV = "LANEPOOL_REDIS_URL"  # where the workers' Redis is, when no --url is given
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# A restarting or failing-over Redis is back within seconds; every command waits for it, up to
# about 35 s in all (50 ms doubling to 1 s, 40 tries), rather than failing the job in hand or
# ending the worker. Longer, the worker ends (exit 1) and Kubernetes starts it again.
RIDE_OUT_A_RESTART = Retry(ExponentialBackoff(cap=1.0, base=0.05), 40)


def connect(url: str) -> Redis:
    """A client for the worker's queue that retries through a Redis restart."""
    return Redis.from_url(url, retry=RIDE_OUT_A_RESTART)


def bounded_client(connection: Redis, timeout: float) -> Redis:
    """A client to the same server as `connection` that gives up after `timeout` seconds, with
    no retry: for what runs while an HTTP answer waits."""
    pool = connection.connection_pool
    kwargs = dict(pool.connection_kwargs)
    kwargs.update(
        socket_timeout=timeout, socket_connect_timeout=timeout, retry=Retry(NoBackoff(), 0)
    )
    return Redis(connection_pool=ConnectionPool(connection_class=pool.connection_class, **kwargs))
