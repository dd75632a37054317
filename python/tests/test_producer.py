"""The producer's side: `lanepool_jobs_submitted_total` carries namespace, pool and lane, and each
job carries its submission time where the workers read it (RQ meta, a Redis-list job's JSON, a
Celery message header), on a real Redis and a real Celery app."""

from __future__ import annotations

import json
import time

import pytest
from celery import Celery
from celery.signals import before_task_publish
from prometheus_client import CollectorRegistry
from redis import Redis
from rq import Queue
from rq.job import Job

from lanepool_worker import ConfigError
from lanepool_worker.producer import SUBMITTED_AT, Producer
from lanepool_worker.rq import submitted_at
from processes import RedisServer


def submitted(registry: CollectorRegistry, lane: str) -> float | None:
    labels = {"namespace": "ns", "pool": "jobs", "lane": lane}
    return registry.get_sample_value("lanepool_jobs_submitted_total", labels)


def test_an_rq_job_is_stamped_and_counted_by_namespace_pool_and_lane(redis: Redis):
    registry = CollectorRegistry()
    producer = Producer("ns", "jobs", registry)
    before = time.time()
    job = producer.submit_rq(Queue("urgent", connection=redis), "jobs.record", 0.1,
                             meta={"mine": 1}, job_timeout=30)  # fmt: skip
    producer.submit_rq(Queue("batch", connection=redis), "jobs.record")
    stored = Job.fetch(job.id, connection=redis)
    assert stored.meta["mine"] == 1 and before <= stored.meta[SUBMITTED_AT] <= time.time()
    assert stored.args == (0.1,) and stored.timeout == 30
    assert submitted_at(stored) == stored.meta[SUBMITTED_AT]
    assert submitted(registry, "urgent") == 1 and submitted(registry, "batch") == 1
    # A second producer on the same registry shares the counter.
    Producer("ns", "jobs", registry).submit_rq(Queue("urgent", connection=redis), "jobs.record")
    assert submitted(registry, "urgent") == 2


def test_an_unstamped_rq_job_waits_from_rqs_own_enqueue_time(redis: Redis):
    job = Queue("urgent", connection=redis).enqueue("jobs.record")
    stamp = submitted_at(Job.fetch(job.id, connection=redis))
    assert stamp is not None and abs(stamp - time.time()) < 5


def test_the_namespace_and_pool_come_from_the_environment_or_are_refused_by_name():
    producer = Producer(
        environ={"LANEPOOL_NAMESPACE": "ns", "LANEPOOL_POOL": "jobs"}, registry=None
    )
    assert (producer.namespace, producer.pool) == ("ns", "jobs")
    with pytest.raises(ConfigError, match="LANEPOOL_NAMESPACE"):
        Producer(environ={"LANEPOOL_POOL": "jobs"}, registry=None)
    with pytest.raises(ConfigError, match="LANEPOOL_POOL"):
        Producer(environ={"LANEPOOL_NAMESPACE": "ns"}, registry=None)


def test_a_redis_list_job_carries_its_id_and_submission_time(redis: Redis):
    registry = CollectorRegistry()
    pushed = Producer("ns", "jobs", registry).submit_list(redis, "batch", {"seconds": 2})
    (raw,) = redis.lrange("lanepool:lane:batch", 0, -1)
    assert json.loads(raw) == pushed
    assert pushed["seconds"] == 2 and len(pushed["id"]) == 32
    assert abs(pushed["submitted_at"] - time.time()) < 5
    assert submitted(registry, "batch") == 1


def test_a_celery_task_is_stamped_in_its_header_and_counted_by_queue(
    redis_server: RedisServer, redis: Redis
):
    registry = CollectorRegistry()
    producer = Producer("ns", "jobs", registry)
    producer.install_celery()
    try:
        app = Celery("producer", broker=redis_server.url)
        before = time.time()
        app.send_task("tasks.anything", args=(1,), queue="urgent")
    finally:
        before_task_publish.disconnect(producer.before_task_publish)
    (raw,) = redis.lrange("urgent", 0, -1)
    headers = json.loads(raw)["headers"]
    assert before <= headers[SUBMITTED_AT] <= time.time()
    assert submitted(registry, "urgent") == 1


def test_a_job_sent_to_a_lanes_queue_of_another_name_counts_under_the_lane(redis: Redis):
    registry = CollectorRegistry()
    environ = {"LANEPOOL_QUEUES": "urgent=high_priority"}
    producer = Producer("ns", "jobs", registry, environ=environ)
    producer.submit_rq(Queue("high_priority", connection=redis), "jobs.record")
    producer.submit_list(redis, "urgent", {"seconds": 0})
    assert submitted(registry, "urgent") == 2 and submitted(registry, "high_priority") is None
    assert redis.llen("lanepool:lane:high_priority") == 1
    # Given, the queues replace the environment's; malformed, they are refused by name.
    given = Producer("ns", "jobs", registry, environ=environ, queues={})
    given.submit_rq(Queue("high_priority", connection=redis), "jobs.record")
    assert submitted(registry, "high_priority") == 1
    with pytest.raises(ConfigError, match=r"^LANEPOOL_QUEUES="):
        Producer("ns", "jobs", None, environ={"LANEPOOL_QUEUES": "urgent=a b"})
