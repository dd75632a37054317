"""An RQ worker that speaks lanepool's protocol: `lanepool-rq-worker` takes the lanes of
`LANEPOOL_LANES` in order (RQ's queues, strict order; each lane's queue is its name unless
`LANEPOOL_QUEUES` says otherwise), stops taking on a drain, takes a stand-in's lanes between jobs,
serves the metrics port, and finishes its job on SIGTERM.

It must never turn a drain into a signal (a second signal makes RQ's shutdown cold), never hold
a job it has not started when it stops, and never count in a forked child (the counts would die
with it): every count is kept in the worker's own process.

The default worker class is RQ's `SimpleWorker` (the job runs in the worker's process). Measured
with python/bench.py (one worker, 2 cores, Redis 7.0, RQ 3.0, two runs): behind a backlog of
50 ms batch jobs, urgent jobs arriving 10 a second waited p50 23-27 ms, p99 51-54 ms with
`simple`, whether they took 5 or 50 ms, against p50 34-52 ms, p99 66-77 ms with `fork`; and 1 ms
jobs ran at 249-259 a second against 54-56: a fork per job costs more than an urgent lane's
short jobs take. `--worker-class fork` (RQ's `Worker`) isolates each job in a child (its memory,
a crash, C code that holds the GIL for long) at that price; the metrics port answers from the
parent either way.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import timezone
from typing import Any

from redis import ConnectionPool, Redis, RedisError
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError
from redis.retry import Retry
from rq.exceptions import DequeueTimeout
from rq.job import Job as RQJob
from rq.queue import Queue
from rq.worker import BaseWorker, SimpleWorker, Worker, WorkerStatus

from .config import SLOTS_ENV, Config, ConfigError, config_from_env, why_off
from .credential import unset_note
from .depth import QueueDepth
from .logs import setup_logging
from .producer import SUBMITTED_AT
from .redis_client import DEFAULT_REDIS_URL, REDIS_URL_ENV, bounded_client, connect
from .server import serve
from .state import Job as InHand
from .state import WorkerState

log = logging.getLogger("lanepool_worker")

# RQ's own idle dequeue blocks for `worker_ttl - 15` s (405 s by default). In slices of at most
# 1 s, SIGTERM and a request that came just as a slice began are seen within a second; a request
# usually ends the slice at once (CLIENT UNBLOCK).
TAKE_SLICE = 1.0

# A take is the one command that is never sent twice: a Redis that pops a job and dies before
# its answer arrives (with appendfsync always, while the pop is written to disk) has the job
# popped for good, and a second pop after the restart takes the next one: the first is left
# "queued" in no list, never to run. So a take cut short by a lost connection is not retried by
# the client; instead, once Redis answers again, the jobs of the worker's lanes left so (queued,
# in no lane, not started) are put back at the head of their lane, after a grace in which a
# worker that did get the answer has long marked its job started.
LOST_TAKE_GRACE = 5.0

# Puts a job popped by a take whose answer was lost back at the head of its lane, unless it is
# no longer queued (a worker started it: RQ marks a job started as it registers it), is in its
# lane already, or was given back by another worker lately (every worker whose take a restart
# cut recovers at once): safe to run from several workers at once. KEYS: the lane's list, its
# intermediate list, the job's hash, the mark of a give-back. ARGV: the job id, the mark's TTL.
GIVE_BACK_LOST = """
if redis.call('HGET', KEYS[3], 'status') ~= 'queued' then return 0 end
if redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
if not redis.call('SET', KEYS[4], '1', 'NX', 'EX', ARGV[2]) then return 0 end
redis.call('LREM', KEYS[2], 0, ARGV[1])
redis.call('LPUSH', KEYS[1], ARGV[1])
return 1
"""

# How long a give-back keeps another worker from giving the same job back: far longer than a
# recovery's grace.
GIVEN_BACK_MARK_SECONDS = 60

# Puts a job a take handed out just as a request came back at the head of its lane, once: a
# retry after a lost answer finds it there already. KEYS: the lane's list, its intermediate
# list. ARGV: the job id.
GIVE_BACK = """
redis.call('LREM', KEYS[2], 1, ARGV[1])
if redis.call('LPOS', KEYS[1], ARGV[1]) then return 0 end
redis.call('LPUSH', KEYS[1], ARGV[1])
return 1
"""


class LaneTaking(BaseWorker):
    """What lanepool changes in an RQ worker: how it takes a job, and what it counts around one.
    Mixed in before `SimpleWorker` or `Worker`."""

    def __init__(self, *args: Any, state: WorkerState, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lanepool_state = state
        config = state.config
        self._lane_queues: dict[str, Queue] = {config.lane_of(q.name): q for q in self.queues}
        # The take blocks on a connection of its own, so that a request can end the wait with
        # CLIENT UNBLOCK from the HTTP thread; the unblocking client gives up after 100 ms. It
        # never retries (see LOST_TAKE_GRACE).
        pool = self.connection.connection_pool
        take_kwargs = dict(pool.connection_kwargs, retry=Retry(NoBackoff(), 0))
        self._take_connection = Redis(
            connection_pool=ConnectionPool(connection_class=pool.connection_class, **take_kwargs),
            single_connection_client=True,
        )
        self._take_cut = False
        # The job `_take` marked busy, for `execute_job` to finish.
        self._in_hand: InHand | None = None
        self._take_client_id: int | None = None
        self._blocked_client_id: int | None = None
        self._unblocker = bounded_client(self.connection, 0.1)
        state.add_listener(self._end_the_wait)

    def _shutdown(self) -> None:
        # RQ raises StopRequested from the signal handler while idle; that could land between the
        # pop of a job and its start and lose the job. A flag instead, seen by the take loop and
        # RQ's work loop; a job in hand is finished first. Ending the wait from here is safe: the
        # unblocking client is never used by the main thread the handler interrupts.
        self._stop_requested = True
        self._end_the_wait()

    def unsubscribe(self) -> None:
        # RQ unsubscribes before it stops its listening thread, which then reads on (for up to
        # 60 s) until a join times out: over a second more per exit. Told to stop first (without
        # waiting), the thread ends on the unsubscribe's answer.
        if self.pubsub_thread and self.pubsub:
            self.pubsub_thread.stop(timeout=0)
            self.pubsub.unsubscribe()
            self.pubsub_thread.join(timeout=1)
            self.pubsub.close()

    def _end_the_wait(self) -> None:
        blocked = self._blocked_client_id
        if blocked is None:
            return
        with contextlib.suppress(RedisError):  # the slice ends within a second anyway
            self._unblocker.client_unblock(blocked)

    def dequeue_job_and_maintain_ttl(
        self, timeout: int | None, max_idle_time: int | None = None
    ) -> tuple[RQJob, Queue] | None:
        self.set_state(WorkerStatus.IDLE)
        idle_since = time.monotonic()
        wait_after_error = 1.0
        while not self._stop_requested:
            try:
                self.heartbeat()
                if self.should_run_maintenance_tasks:
                    self.run_maintenance_tasks()
                if self._take_cut:
                    self._give_back_lost_takes()
                    self._take_cut = False
                taken = self._take(burst=timeout is None)
                wait_after_error = 1.0
            except (RedisConnectionError, RedisTimeoutError) as e:
                self._take_client_id = None
                # A take cut short may have popped a job whose answer never came.
                self._take_cut = True
                log.error(
                    "%s: Redis unreachable: %s; trying again in %.0f s",
                    self.lanepool_state.config.name,
                    e,
                    wait_after_error,
                )
                self._pause(wait_after_error)
                wait_after_error = min(wait_after_error * 2, 30.0)
                continue
            if taken is not None:
                return taken
            if timeout is None:
                return None  # burst mode: nothing left in the lanes
            if max_idle_time is not None and time.monotonic() - idle_since >= max_idle_time:
                return None
        return None

    def _take(self, burst: bool) -> tuple[RQJob, Queue] | None:
        """One slice: a job from the first non-empty lane to take now, or None."""
        state = self.lanepool_state
        seen = state.requests_seen()
        lanes = state.lanes_to_take()
        if not lanes:  # draining: wait for a request, a lapse or SIGTERM
            end = time.monotonic() + (0 if burst else TAKE_SLICE)
            while not self._stop_requested and time.monotonic() < end:
                if state.wait_for_change(0.1):
                    break
            return None
        queues = [self._lane_queue(lane) for lane in lanes]
        # RQ's perform_job takes a single queue's job out of its intermediate list only when the
        # worker has a single queue: the worker's queues must be the ones taken from.
        self.queues = self._ordered_queues = queues
        slice_seconds: float | None = None
        if not burst:
            lapse = state.next_change_in()
            slice_seconds = TAKE_SLICE if lapse is None else max(0.01, min(TAKE_SLICE, lapse))
            if self._take_client_id is None:
                self._take_client_id = self._take_connection.client_id()
        self._blocked_client_id = self._take_client_id
        try:
            taken = self.queue_class.dequeue_any(
                queues,
                slice_seconds,  # type: ignore[arg-type]  # Redis takes a fraction of a second
                connection=self._take_connection,
                job_class=self.job_class,
                serializer=self.serializer,
                death_penalty_class=self.death_penalty_class,
            )
        except DequeueTimeout:
            # Asked again after an empty slice: a connection redis-py opened anew on its own
            # (a Redis restart) has a new id.
            self._take_client_id = None
            return None
        finally:
            self._blocked_client_id = None
        if taken is None:
            return None
        job, queue = taken
        lane = state.config.lane_of(queue.name)
        queue = self._lane_queue(lane)
        job.connection = self.connection
        job.redis_server_version = self.get_redis_server_version()
        # Busy before the job is known wanted, in one step with the drain check: a drain answered
        # between a check and a later mark would say idle while this job starts.
        in_hand = state.job_taken(lane, submitted_at(job), requests_seen=seen)
        if in_hand is None or self._stop_requested:
            # The protocol's "a job the queue handed out just then goes back to its lane".
            # A give-back that fails leaves the job queued in no lane: the next take, after
            # the lost connection, puts it back (see LOST_TAKE_GRACE).
            try:
                self._give_back(job, queue)
            finally:
                if in_hand is not None:
                    state.job_handed_back(in_hand)
            return None
        self._in_hand = in_hand
        self.log.info("Worker %s: %s: %s (%s)", self.name, queue.name, job.description, job.id)
        return job, queue

    def _lost_takes(self) -> dict[str, str]:
        """The jobs of the worker's lanes that a take popped without its answer: queued (not
        started), yet not in their lane. By job id, their lane. The statuses are read first and
        the lanes after, so that a job enqueued meanwhile is found in its lane."""
        lanes = {self._lane_queue(lane).key: lane for lane in self.lanepool_state.config.lanes}
        queue_prefix = self.queue_class.redis_queue_namespace_prefix
        prefix = self.job_class.redis_job_namespace_prefix
        queued: dict[str, str] = {}
        keys = self.connection.scan_iter(match=f"{prefix}*", count=1000, _type="hash")
        for chunk in _chunks(keys, 1000):
            with self.connection.pipeline(transaction=False) as pipe:
                for key in chunk:
                    pipe.hmget(key, "status", "origin")
                answers = pipe.execute()
            for key, (status, origin) in zip(chunk, answers, strict=True):
                if status != b"queued" or origin is None:
                    continue
                lane_key = f"{queue_prefix}{origin.decode()}"  # the origin is the queue's name
                if lane_key in lanes:
                    queued[key.decode().removeprefix(prefix)] = lanes[lane_key]
        if not queued:
            return {}
        in_lanes = {
            lane: {job_id.decode() for job_id in self.connection.lrange(key, 0, -1)}
            for key, lane in lanes.items()
        }
        return {job_id: lane for job_id, lane in queued.items() if job_id not in in_lanes[lane]}

    def _give_back_lost_takes(self) -> None:
        """After a take was cut short: the jobs popped without an answer (by this worker or
        another), still lost after LOST_TAKE_GRACE, go back to the head of their lane. A worker
        told to stop meanwhile leaves them to the others whose take was cut."""
        first = self._lost_takes()
        if not first:
            return
        log.warning(
            "%s: %d job(s) queued in no lane after a take was cut short (%s): back at the head "
            "of their lane in %.0f s unless started meanwhile",
            self.lanepool_state.config.name,
            len(first),
            ", ".join(sorted(first)),
            LOST_TAKE_GRACE,
        )
        self._pause(LOST_TAKE_GRACE)
        if self._stop_requested:
            return
        again = self._lost_takes()
        give_back = self.connection.register_script(GIVE_BACK_LOST)
        for job_id, lane in again.items():
            if first.get(job_id) != lane:
                continue
            queue = self._lane_queue(lane)
            keys = [
                queue.key,
                queue.intermediate_queue_key,
                self.job_class.key_for(job_id),
                f"{queue.key}:lanepool-given-back:{job_id}",
            ]
            if give_back(keys=keys, args=[job_id, GIVEN_BACK_MARK_SECONDS]):
                log.warning(
                    "%s: job %s of lane %s was popped by a take that lost its answer (Redis "
                    "went away); it is back at the head of its lane",
                    self.lanepool_state.config.name,
                    job_id,
                    lane,
                )

    def _give_back(self, job: RQJob, queue: Queue) -> None:
        give_back = self.connection.register_script(GIVE_BACK)
        give_back(keys=[queue.key, queue.intermediate_queue_key], args=[job.id])

    def _lane_queue(self, lane: str) -> Queue:
        """The RQ queue `lane`'s jobs are in."""
        if lane not in self._lane_queues:
            self._lane_queues[lane] = self.queue_class(
                self.lanepool_state.config.queue(lane),
                connection=self.connection,
                job_class=self.job_class,
                serializer=self.serializer,
                death_penalty_class=self.death_penalty_class,
            )
        return self._lane_queues[lane]

    def _pause(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while not self._stop_requested and time.monotonic() < end:
            time.sleep(0.05)

    def execute_job(self, job: RQJob, queue: Queue) -> None:
        # Counted here, in the worker's own process, for the fork worker too: its child's counts
        # die with the child. The job time is the slot's: RQ's bookkeeping (and a fork) included,
        # since that is what a worker spends per job.
        in_hand, self._in_hand = self._in_hand, None
        if in_hand is None:  # not taken by `_take` (RQ's own callers): busy from here
            lane = self.lanepool_state.config.lane_of(queue.name)
            in_hand = self.lanepool_state.job_started(lane, submitted_at(job))
        try:
            super().execute_job(job, queue)
        finally:
            self.lanepool_state.job_finished(in_hand)


class LaneSimpleWorker(LaneTaking, SimpleWorker):
    """Runs each job in the worker's process (the default)."""


class LaneForkWorker(LaneTaking, Worker):
    """Runs each job in a forked child, as `rq worker` does."""


WORKER_CLASSES: dict[str, type[LaneTaking]] = {
    "simple": LaneSimpleWorker,
    "fork": LaneForkWorker,
}


def _chunks(items: Iterator[Any], size: int) -> Iterator[list[Any]]:
    """`items` in lists of at most `size`."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def submitted_at(job: RQJob) -> float | None:
    """When the job was submitted (Unix seconds): the producer's stamp, else RQ's enqueued_at."""
    stamped = (job.meta or {}).get(SUBMITTED_AT)
    if isinstance(stamped, int | float):
        return float(stamped)
    enqueued = job.enqueued_at
    if enqueued is None:
        return None
    if enqueued.tzinfo is None:
        enqueued = enqueued.replace(tzinfo=timezone.utc)
    return enqueued.timestamp()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lanepool-rq-worker",
        description="An RQ worker for a LanePool: takes the lanes of LANEPOOL_LANES in order "
        "(RQ queues, each named as its lane unless LANEPOOL_QUEUES says otherwise), serves "
        "/metrics, POST /drain and POST /stand-in at LANEPOOL_METRICS_ADDR.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL),
        help=f"Redis URL (default: ${REDIS_URL_ENV} or {DEFAULT_REDIS_URL})",
    )
    parser.add_argument(
        "--worker-class",
        choices=sorted(WORKER_CLASSES),
        default="simple",
        help="simple: jobs run in the worker's process (default); fork: in a child",
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        help="a directory to import job functions from (repeatable; default .)",
    )
    parser.add_argument("--name", help="the RQ worker's name (default: the Pod's, made unique)")
    parser.add_argument("--logging-level", default="INFO", help="RQ's log level")
    args = parser.parse_args(argv)  # fmt: skip

    try:
        config = config_from_env()
        if config.slots != 1:
            raise ConfigError(
                f"{SLOTS_ENV}={config.slots}: lanepool-rq-worker runs one job at a time; run "
                "more Pods instead, or lanepool-redis-worker or Celery for several jobs per Pod"
            )
    except ConfigError as e:
        print(f"lanepool-rq-worker: error: {e}", file=sys.stderr)
        if why_off() is not None:
            # lanepool's own command, run outside a LanePool (a laptop): say what to run instead.
            print(
                "lanepool-rq-worker: outside a LanePool, plain RQ takes the same jobs: "
                "rq worker QUEUE... (in priority order)",
                file=sys.stderr,
            )
        return 2
    for path in reversed(args.path or ["."]):
        sys.path.insert(0, os.path.abspath(path))
    setup_logging()

    connection = connect(args.url)
    state = WorkerState(config)
    keys = {lane: Queue(config.queue(lane), connection=connection).key for lane in config.lanes}
    state.registry.register(QueueDepth(connection, keys))
    worker = run_rq_worker(config, state, connection, args.worker_class, args.name)
    worker.work(logging_level=args.logging_level)
    # A warm shutdown (SIGTERM) is a success; RQ's loop ending for any other reason is not.
    return 0 if worker._stop_requested else 1


def run_rq_worker(
    config: Config,
    state: WorkerState,
    connection: Redis,
    worker_class: str = "simple",
    name: str | None = None,
) -> LaneTaking:
    """Starts the metrics port (unless LANEPOOL_METRICS_ADDR=off) and returns the worker, ready
    for `.work()`."""
    # RQ refuses a name a live worker still holds: a container restarted in the same Pod would
    # wait for the old one's key to expire. The Pod's name, made unique per process.
    name = name or f"{config.name}.{uuid.uuid4().hex[:6]}"
    queues = [config.queue(lane) for lane in config.lanes]
    worker = WORKER_CLASSES[worker_class](queues, connection=connection, name=name, state=state)
    metrics = "off"
    if config.metrics_addr is not None:
        host, port = serve(state, config.metrics_addr).address
        metrics = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
    log.info(
        "%s: %s worker of pool %s, lanes %s (in this order), RQ %s worker, metrics %s",
        config.name,
        config.role,
        config.pool,
        config.lanes_shown(),
        worker_class,
        metrics,
    )
    if config.metrics_addr is not None and config.credential_file is None:
        log.warning("%s", unset_note(config.name))
    return worker


if __name__ == "__main__":
    sys.exit(main())
