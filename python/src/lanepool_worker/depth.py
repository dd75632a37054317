"""`lanepool_queue_depth{lane}` read from Redis by the workers, so a lane's arrival rate needs no
change to the producer: arrivals = jobs finished + the change in depth.

    sum by (namespace, pool, lane) (rate(lanepool_job_duration_seconds_count{pool!=""}[1m]))
  + max by (namespace, pool, lane) (deriv(lanepool_queue_depth{pool!=""}[1m]))

(every worker of a pool reads the same lists, so `max` keeps one depth per lane). The producer's
own `lanepool_jobs_submitted_total` stays the better source when the producer can count: it sees
a burst as it is submitted, the depth only a scrape later. A depth it cannot read is absent from
the answer, never 0; one read costs at most one 100 ms round trip a second, whatever the scrapes.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from redis import Redis, RedisError

from .redis_client import bounded_client

log = logging.getLogger("lanepool_worker")


class QueueDepth(Collector):
    """LLEN of each lane's list (`keys`: lane → Redis key), cached for `max_age` seconds."""

    def __init__(
        self,
        connection: Redis,
        keys: Mapping[str, str],
        max_age: float = 1.0,
        timeout: float = 0.1,
    ) -> None:
        self._client = bounded_client(connection, timeout)
        self._keys = dict(keys)
        self._max_age = max_age
        self._lock = threading.Lock()
        self._read_at = -float("inf")
        self._depths: dict[str, int] | None = None
        self._failing = False

    def collect(self) -> Iterator[Metric]:
        depths = self._read()
        family = GaugeMetricFamily(
            "lanepool_queue_depth",
            "Jobs waiting in the lane (LLEN of its Redis list)",
            labels=["lane"],
        )
        for lane, depth in (depths or {}).items():
            family.add_metric([lane], depth)
        yield family

    def _read(self) -> dict[str, int] | None:
        # One reader at a time; the others take its answer. A failed read is kept as long as a
        # good one, so a Redis that is down costs one timeout a second, not one per answer.
        with self._lock:
            if time.monotonic() - self._read_at < self._max_age:
                return self._depths
            try:
                with self._client.pipeline(transaction=False) as pipe:
                    for key in self._keys.values():
                        pipe.llen(key)
                    lengths = pipe.execute()
                self._depths = dict(zip(self._keys, map(int, lengths), strict=True))
                self._failing = False
            except RedisError as e:
                if not self._failing:
                    log.warning("lanepool_queue_depth: cannot read the lanes' lengths: %s", e)
                self._failing = True
                self._depths = None
            self._read_at = time.monotonic()
            return self._depths
