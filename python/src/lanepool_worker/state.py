"""One worker process's side of the protocol: the jobs in hand, the operator's drain and stand-in
requests, which lanes to take from next, and the metric convention they are exported as.

Thread-safe (the HTTP server, the taker and the jobs run on different threads). It never takes or
runs a job itself, and never blocks on anything but its own lock.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .config import Config
from .protocol import LONGEST_DRAIN, MOST_STAND_IN_LANES, is_dns_label

log = logging.getLogger("lanepool_worker")

# Job times from a few ms (an urgent lane) to minutes (batch): the operator reads only `_count`
# and `_sum`; the buckets are for people's dashboards and wait percentiles.
JOB_TIME_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


@dataclass(frozen=True)
class Job:
    """A job in hand, as `job_started` returns it for `job_finished`."""

    lane: str
    started_at: float  # Unix seconds, exported while the job runs
    started: float  # time.monotonic(), for the job time
    serial: int  # two jobs started in the same instant stay two


@dataclass(frozen=True)
class _StandIn:
    lanes: tuple[str, ...]
    seconds: int  # as asked, for the log
    until: float  # time.monotonic()


class WorkerState:
    """What the operator asked of this worker and what it has in hand; one per process."""

    def __init__(self, config: Config, registry: CollectorRegistry | None = None) -> None:
        self.config = config
        # A registry of its own: the answer holds the convention only, not the process's
        # other metrics, so it stays far below the operator's 256 KiB and 4,096 lines.
        self.registry = registry if registry is not None else CollectorRegistry()
        self._changed = threading.Condition(threading.Lock())
        self._drain_until: float | None = None
        self._stand_in: _StandIn | None = None
        self._requests = 0
        self._in_hand: dict[int, Job] = {}
        self._serials = itertools.count()
        self._listeners: list[Callable[[], None]] = []
        # What the taker last saw, so that each start and end is logged once.
        self._seen_draining = False
        self._seen_stand_in: _StandIn | None = None
        self.job_duration = Histogram(
            "lanepool_job_duration_seconds",
            "Time this worker spent running each job",
            ["lane"],
            buckets=JOB_TIME_BUCKETS,
            registry=self.registry,
        )
        self.job_wait = Histogram(
            "lanepool_job_wait_seconds",
            "Time from a job's submission to its start",
            ["lane"],
            buckets=JOB_TIME_BUCKETS,
            registry=self.registry,
        )
        # Declared per own lane before any job ends: "none finished yet" reads as 0, not absent.
        for lane in config.lanes:
            self.job_duration.labels(lane)
            self.job_wait.labels(lane)
        self.registry.register(_WorkerGauges(self))

    # -- the operator's requests ---------------------------------------------------------------

    def drain(self, seconds: float) -> None:
        """Take no new job for `seconds` (0: take jobs again at once). A drain above 0 ends any
        stand-in: the worker is about to be stopped, and calling the drain off brings back its
        own lanes."""
        if not 0 <= seconds <= LONGEST_DRAIN:
            raise ValueError(f"a drain lasts 0 to {LONGEST_DRAIN} s, not {seconds}")
        with self._changed:
            if seconds > 0:
                self._drain_until = time.monotonic() + seconds
                self._stand_in = None
            else:
                self._drain_until = None
        self._announce()

    def stand_in(self, lanes: Sequence[str], seconds: int) -> None:
        """Take jobs from `lanes`, in this order, instead of the own lanes for `seconds`
        (0: the own lanes again at once). Replaces the last stand-in; does not end a drain."""
        lanes = tuple(lanes)
        if not 0 <= seconds <= LONGEST_DRAIN or (seconds > 0 and not lanes):
            raise ValueError(f"a stand-in takes 1 or more lanes for 0 to {LONGEST_DRAIN} s")
        if len(lanes) > MOST_STAND_IN_LANES or not all(map(is_dns_label, lanes)):
            raise ValueError(f"not lanes a stand-in can take: {lanes}")
        with self._changed:
            until = time.monotonic() + seconds
            self._stand_in = _StandIn(lanes, seconds, until) if seconds > 0 else None
        self._announce()

    def add_listener(self, callback: Callable[[], None]) -> None:
        """`callback()` runs after every accepted request, on the thread that made it (the HTTP
        server's): it must return quickly, the answer waits for it."""
        with self._changed:
            self._listeners.append(callback)

    def _announce(self) -> None:
        with self._changed:
            self._requests += 1
            self._changed.notify_all()
            listeners = list(self._listeners)
        for listener in listeners:
            try:
                listener()
            except Exception:
                log.exception("a lanepool request listener failed")

    # -- what the taker asks -------------------------------------------------------------------

    def lanes_to_take(self) -> list[str]:
        """The lanes to take the next job from, in order; [] while draining. Logs each drain and
        stand-in as the taker first sees it start and end."""
        with self._changed:
            now = time.monotonic()
            draining = self._drain_until is not None and self._drain_until > now
            stand_in = self._active_stand_in(now)
            if stand_in != self._seen_stand_in:
                self._seen_stand_in = stand_in
                if stand_in is not None:
                    log.info(
                        "%s: standing in: lanes %s (for %d s)",
                        self.config.name,
                        ",".join(stand_in.lanes),
                        stand_in.seconds,
                    )
                else:
                    own = ",".join(self.config.lanes)
                    log.info("%s: stand-in over: lanes %s again", self.config.name, own)
            if draining != self._seen_draining:
                self._seen_draining = draining
                if draining:
                    log.info("%s: draining: no new jobs", self.config.name)
                else:
                    log.info("%s: drain over: taking jobs again", self.config.name)
            if draining:
                return []
            return list(stand_in.lanes if stand_in is not None else self.config.lanes)

    def draining(self) -> bool:
        with self._changed:
            return self._drain_until is not None and self._drain_until > time.monotonic()

    def standing_in(self) -> tuple[str, ...] | None:
        with self._changed:
            stand_in = self._active_stand_in(time.monotonic())
            return stand_in.lanes if stand_in is not None else None

    def requests_seen(self) -> int:
        """How many requests were accepted: a take that began before a change hands its job
        back when it can (the protocol's "a job the queue handed out just then")."""
        with self._changed:
            return self._requests

    def next_change_in(self) -> float | None:
        """Seconds until the drain or stand-in now on lapses by itself; None: none is on."""
        with self._changed:
            now = time.monotonic()
            lapse = self._next_lapse(now)
            return None if lapse is None else lapse - now

    def wait_for_change(self, timeout: float) -> bool:
        """Waits up to `timeout` s for a request, or for a drain or stand-in to lapse; True if
        one came (the lanes to take may differ)."""
        with self._changed:
            seen = self._requests
            now = time.monotonic()
            lapse = self._next_lapse(now)
            end = now + max(0.0, timeout)
            if lapse is not None and lapse < end:
                end = lapse
            while self._requests == seen:
                left = end - time.monotonic()
                if left <= 0:
                    return lapse is not None and end == lapse
                self._changed.wait(left)
            return True

    def _active_stand_in(self, now: float) -> _StandIn | None:
        stand_in = self._stand_in
        return stand_in if stand_in is not None and stand_in.until > now else None

    def _next_lapse(self, now: float) -> float | None:
        ends = [self._drain_until, self._stand_in.until if self._stand_in else None]
        future = [end for end in ends if end is not None and end > now]
        return min(future) if future else None

    # -- jobs ----------------------------------------------------------------------------------

    def job_started(self, lane: str, submitted_at: float | None = None) -> Job:
        """Marks a slot busy with a job of `lane`; `submitted_at` (Unix seconds), when known,
        gives the job's wait."""
        job = Job(lane, time.time(), time.monotonic(), next(self._serials))
        self._observe_wait(job, submitted_at)
        with self._changed:
            self._in_hand[job.serial] = job
        return job

    def _observe_wait(self, job: Job, submitted_at: float | None) -> None:
        if submitted_at is not None:
            # Clocks of producer and worker differ a little: never a negative wait.
            self.job_wait.labels(job.lane).observe(max(0.0, job.started_at - submitted_at))

    def job_taken(
        self, lane: str, submitted_at: float | None = None, *, requests_seen: int
    ) -> Job | None:
        """Marks a slot busy with a job a take handed out, unless a request came since the take
        began (`requests_seen`, from `requests_seen()`) or a drain is on: then None, and the
        taker gives the job back to its lane. The mark and the check hold the lock `drain` holds,
        so a drain's answer never says idle for a worker about to start a job: a drain that
        comes first sends the job back, one that comes after sees it busy."""
        job = Job(lane, time.time(), time.monotonic(), next(self._serials))
        with self._changed:
            now = time.monotonic()
            draining = self._drain_until is not None and self._drain_until > now
            if draining or self._requests != requests_seen:
                return None
            self._in_hand[job.serial] = job
        self._observe_wait(job, submitted_at)
        return job

    def job_handed_back(self, job: Job) -> None:
        """Frees the slot of a job marked busy but given back unrun: no job time is counted."""
        with self._changed:
            self._in_hand.pop(job.serial, None)

    def job_finished(self, job: Job) -> None:
        """Frees the job's slot and counts its run time (a failed job took its time too)."""
        with self._changed:
            if self._in_hand.pop(job.serial, None) is None:
                return  # finished twice: counted once
        self.job_duration.labels(job.lane).observe(time.monotonic() - job.started)

    def jobs_in_hand(self) -> list[Job]:
        with self._changed:
            return list(self._in_hand.values())

    # -- the answer ----------------------------------------------------------------------------

    def render(self) -> bytes:
        """The Prometheus text exposition of the convention, as `/metrics` answers it."""
        return generate_latest(self.registry)


class _WorkerGauges(Collector):
    """The per-worker gauges, built at each answer: `lanepool_worker_busy` mixes a labelled
    series per lane in hand with an unlabelled 0 while idle, which plain Gauges cannot."""

    def __init__(self, state: WorkerState) -> None:
        self._state = state

    def collect(self) -> Iterator[Metric]:
        state = self._state
        jobs = state.jobs_in_hand()
        busy = GaugeMetricFamily(
            "lanepool_worker_busy",
            "Jobs the worker runs now, by lane; 0 (no lane) while it waits",
        )
        started = GaugeMetricFamily(
            "lanepool_worker_job_started_timestamp_seconds",
            "When the latest job in hand of the lane started (Unix time)",
        )
        by_lane: dict[str, list[Job]] = {}
        for job in jobs:
            by_lane.setdefault(job.lane, []).append(job)
        for lane, lane_jobs in sorted(by_lane.items()):
            busy.add_sample("lanepool_worker_busy", {"lane": lane}, len(lane_jobs))
            latest = max(job.started_at for job in lane_jobs)
            started.add_sample(started.name, {"lane": lane}, round(latest, 3))
        if not by_lane:
            busy.add_sample("lanepool_worker_busy", {}, 0)
        yield busy
        yield started
        yield GaugeMetricFamily(
            "lanepool_worker_draining",
            "1 while the worker takes no new job (POST /drain)",
            value=int(state.draining()),
        )
        yield GaugeMetricFamily(
            "lanepool_worker_standing_in",
            "1 while a stand-in request has the worker take other lanes than its own "
            "(POST /stand-in)",
            value=int(state.standing_in() is not None),
        )
        yield GaugeMetricFamily(
            "lanepool_worker_slots",
            "Jobs the worker runs at once (LANEPOOL_SLOTS)",
            value=state.config.slots,
        )
        # Always 1: the metrics port (`serve`) refuses every POST without the credential, even
        # with none configured. Its absence is how the operator tells an image that predates it.
        yield GaugeMetricFamily(
            "lanepool_worker_credential_required",
            "1: drain and stand-in requests need the pool's worker credential",
            value=1,
        )
