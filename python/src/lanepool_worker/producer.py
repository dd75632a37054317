"""The producer's side of the convention: count `lanepool_jobs_submitted_total{namespace, pool,
lane}` and stamp each job with its submission time (for the workers' wait histogram), for RQ,
Celery and Redis-list jobs.

It only counts and stamps: it must never change what a job does or which lane it goes to. The
producer is not a worker Pod, so its series carry the namespace and pool themselves, and the lane
of a queue not named as its lane (`spec.lanes[].queue`) from `queues` or LANEPOOL_QUEUES.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from prometheus_client import REGISTRY, CollectorRegistry, Counter

from .config import POOL_ENV, QUEUES_ENV, ConfigError, queues_from

if TYPE_CHECKING:
    from redis import Redis
    from rq.job import Job as RQJob
    from rq.queue import Queue
    from rq.types import FunctionReferenceType

NAMESPACE_ENV = "LANEPOOL_NAMESPACE"
SUBMITTED_AT = "lanepool_submitted_at"  # RQ job meta and Celery message header, Unix seconds
DEFAULT_KEY_PREFIX = "lanepool:lane:"  # as lanepool-redis-worker's --key-prefix

# One counter per registry: a second Producer on the same registry shares it, instead of
# failing on a duplicate series.
_counters: dict[int, Counter] = {}
_counters_lock = threading.Lock()


class Producer:
    """Counts and stamps submissions for the LanePool `pool` in `namespace` (each from
    LANEPOOL_NAMESPACE and LANEPOOL_POOL when not given). `registry` is where the counter is
    exported, prometheus_client's default one unless told (None: nowhere, for tests). `queues`
    (lane → queue, from LANEPOOL_QUEUES when not given, in its `urgent=high_priority` form) names
    each lane whose queue is not named as the lane, as the pool's spec.lanes[].queue does: a job
    sent to such a queue counts under its lane."""

    def __init__(
        self,
        namespace: str | None = None,
        pool: str | None = None,
        registry: CollectorRegistry | None = REGISTRY,
        environ: Mapping[str, str] = os.environ,
        queues: Mapping[str, str] | None = None,
    ) -> None:
        self.namespace = namespace or _required(environ, NAMESPACE_ENV, "its namespace")
        self.pool = pool or _required(environ, POOL_ENV, "its name")
        self.submitted = _counter(registry)
        self.queues = dict(
            queues if queues is not None else queues_from(environ.get(QUEUES_ENV, ""))
        )
        self._lanes = {queue: lane for lane, queue in self.queues.items()}

    def count(self, lane: str, jobs: int = 1) -> None:
        self.submitted.labels(self.namespace, self.pool, lane).inc(jobs)

    def lane_of(self, queue: str) -> str:
        """The lane whose jobs `queue` holds: the queue's name, unless `queues` says otherwise."""
        return self._lanes.get(queue, queue)

    def submit_rq(
        self, queue: Queue, func: FunctionReferenceType, *args: Any, **kwargs: Any
    ) -> RQJob:
        """`queue.enqueue(func, *args, **kwargs)`, with the submission time in the job's meta."""
        meta = {**(kwargs.pop("meta", None) or {}), SUBMITTED_AT: time.time()}
        job = queue.enqueue(func, *args, meta=meta, **kwargs)
        self.count(self.lane_of(queue.name))
        return job

    def submit_list(
        self,
        redis: Redis,
        lane: str,
        job: Mapping[str, Any] | None = None,
        key_prefix: str = DEFAULT_KEY_PREFIX,
    ) -> dict[str, Any]:
        """RPUSHes `job` (a JSON object, given an `id` when it has none) to the lane's list (its
        queue's) with `submitted_at`, as lanepool-redis-worker reads it; returns what was
        pushed."""
        payload = {"id": uuid.uuid4().hex, **(job or {}), "submitted_at": time.time()}
        redis.rpush(f"{key_prefix}{self.queues.get(lane, lane)}", json.dumps(payload))
        self.count(lane)
        return payload

    def before_task_publish(
        self,
        sender: str | None = None,
        headers: dict[str, Any] | None = None,
        routing_key: str | None = None,
        **_: Any,
    ) -> None:
        """Celery's `before_task_publish` handler: stamps the message header and counts the job
        under its queue's lane (the queue: the routing key of Celery's default direct
        exchange)."""
        if headers is not None:
            headers[SUBMITTED_AT] = time.time()
        self.count(self.lane_of(routing_key or "celery"))

    def install_celery(self) -> None:
        """Connects `before_task_publish` for every task this process sends."""
        from celery.signals import before_task_publish

        before_task_publish.connect(self.before_task_publish, weak=False)


def _required(environ: Mapping[str, str], name: str, what: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise ConfigError(
            f"{name} is not set: expected the LanePool's {what}, which the producer's counter "
            "carries (or pass it to Producer)"
        )
    return value


def _counter(registry: CollectorRegistry | None) -> Counter:
    def make(registry: CollectorRegistry | None) -> Counter:
        return Counter(
            "lanepool_jobs_submitted",
            "Jobs submitted to the lane, by the producer",
            ["namespace", "pool", "lane"],
            registry=registry,
        )

    if registry is None:
        return make(None)
    with _counters_lock:
        if id(registry) not in _counters:
            _counters[id(registry)] = make(registry)
        return _counters[id(registry)]


_default: Producer | None = None


def default_producer() -> Producer:
    """The process's Producer, from LANEPOOL_NAMESPACE and LANEPOOL_POOL, on the default
    registry."""
    global _default
    if _default is None:
        _default = Producer()
    return _default


def submit_rq(queue: Queue, func: FunctionReferenceType, *args: Any, **kwargs: Any) -> RQJob:
    """`default_producer().submit_rq(...)`: enqueue, stamp and count."""
    return default_producer().submit_rq(queue, func, *args, **kwargs)


def install_celery_hook() -> None:
    """`default_producer().install_celery()`: stamp and count every task this process sends."""
    default_producer().install_celery()
