"""The guide's worker for home-grown queues, on asyncio: `run_worker` runs LANEPOOL_SLOTS jobs at
once, each slot taking from `state.lanes_to_take()` in order, and finishes the jobs in hand on
SIGTERM; `RedisLists` is a ready-made queue on Redis lists, run by `lanepool-redis-worker`.

It must never take a job while draining, cut a job short, or drop one: a job taken just as a
request came is given back to the front of its lane, and a job that cannot be read is set aside.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import inspect
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from redis import RedisError
from redis.asyncio import Redis as AsyncRedis

from .config import ConfigError, config_from_env
from .credential import unset_note
from .depth import QueueDepth
from .logs import setup_logging
from .producer import DEFAULT_KEY_PREFIX
from .redis_client import DEFAULT_REDIS_URL, REDIS_URL_ENV, bounded_client, connect
from .server import serve
from .state import WorkerState

log = logging.getLogger("lanepool_worker")

# The longest a slot waits in one take: a request usually ends the wait at once (the queue
# follows the state), and SIGTERM or a request that came just as a take began within a second.
TAKE_SLICE = 1.0

# A give-back that fails (a Redis blip) is tried again after 0.1, 0.2, 0.4 and 0.8 s: a job held
# longer keeps its slot from taking, and a Redis down for longer is not waited for job by job.
GIVE_BACK_TRIES = 5
GIVE_BACK_FIRST_PAUSE = 0.1


class QueueJob(Protocol):
    """What `run_worker` needs of a job: its lane and, when known, its submission time."""

    @property
    def lane(self) -> str: ...

    @property
    def submitted_at(self) -> float | None: ...


J = TypeVar("J", bound=QueueJob)


async def run_worker(
    take: Callable[[Sequence[str], float], Awaitable[J | None]],
    run: Callable[[J], Awaitable[None]],
    state: WorkerState,
    *,
    give_back: Callable[[J], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
) -> None:
    """Runs `state.config.slots` slots until `stop` is set (by default on SIGTERM or SIGINT),
    then returns once every job in hand is done.

    `take(lanes, timeout)` returns a job from the first non-empty lane of `lanes` within
    `timeout` seconds, or None; it is never cancelled (a cancelled take could lose its job).
    `run(job)` runs it; an exception is logged and the job counts as run. `give_back(job)`, when
    given, puts back at the front of its lane a job taken just as a request or SIGTERM came.
    """
    loop = asyncio.get_running_loop()
    if stop is None:
        stop = asyncio.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(signum, stop.set)
    changes = _Changes()

    def heard() -> None:  # on the HTTP thread
        loop.call_soon_threadsafe(changes.bump)

    state.add_listener(heard)

    async def slot() -> None:
        while not stop.is_set():
            lanes = state.lanes_to_take()
            lapse = state.next_change_in()
            wait = TAKE_SLICE if lapse is None else max(0.01, min(TAKE_SLICE, lapse))
            if not lanes:  # draining: until a request, a lapse or SIGTERM
                await _first_of(stop.wait(), changes.next(), timeout=wait)
                continue
            seen = state.requests_seen()
            job = await take(lanes, wait)
            if job is None:
                continue
            if give_back is None:
                # Nowhere to put it back: it runs, busy from now on.
                in_hand = state.job_started(job.lane, job.submitted_at)
            else:
                # Busy in one step with the drain check, before anything else can run: a drain
                # answered in between would say idle while this job starts.
                taken = state.job_taken(job.lane, job.submitted_at, requests_seen=seen)
                if taken is None or stop.is_set():
                    if taken is not None:
                        state.job_handed_back(taken)
                    # The protocol's "a job the queue handed out just then".
                    await _hand_back(give_back, job, state.config.name)
                    continue
                in_hand = taken
            try:
                await run(job)
            except Exception:
                log.exception("%s: a %s job failed", state.config.name, job.lane)
            finally:
                state.job_finished(in_hand)

    await asyncio.gather(*(slot() for _ in range(state.config.slots)))


async def _hand_back(give_back: Callable[[J], Awaitable[None]], job: J, name: str) -> None:
    """Gives `job` back to its lane, trying GIVE_BACK_TRIES times: a failure is this slot's
    alone (it must never end the other slots' jobs), and a job that cannot go back is named at
    error level rather than dropped unsaid."""
    pause = GIVE_BACK_FIRST_PAUSE
    for attempt in range(1, GIVE_BACK_TRIES + 1):
        try:
            await give_back(job)
            return
        except Exception as error:
            if attempt == GIVE_BACK_TRIES:
                log.error(
                    "%s: job %s of lane %s is lost: it was taken just as a request or SIGTERM "
                    "came and could not be given back (%d tries, last: %s)",
                    name,
                    _job_id(job),
                    job.lane,
                    GIVE_BACK_TRIES,
                    error,
                )
                return
            log.warning(
                "%s: could not give job %s back to lane %s (%s); trying again in %.1f s",
                name,
                _job_id(job),
                job.lane,
                error,
                pause,
            )
            await asyncio.sleep(pause)
            pause *= 2


def _job_id(job: QueueJob) -> str:
    # QueueJob asks for no id: a job type without one is named by its repr.
    job_id = getattr(job, "id", None)
    return str(job_id) if job_id is not None else repr(job)


class _Changes:
    """Wakes every slot waiting for a request: one event per request, replaced when set."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def bump(self) -> None:
        self._event.set()
        self._event = asyncio.Event()

    def next(self) -> Awaitable[Any]:
        return self._event.wait()


async def _first_of(*waits: Awaitable[Any], timeout: float) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()


@dataclass(frozen=True)
class ListJob:
    """A job of a Redis list: a JSON object, with `submitted_at` (Unix seconds) when stamped."""

    lane: str
    payload: dict[str, Any]
    raw: bytes

    @property
    def id(self) -> str | None:
        """The producer's id (`Producer.submit_list` sets one), for the logs."""
        job_id = self.payload.get("id")
        return str(job_id) if job_id is not None else None

    @property
    def submitted_at(self) -> float | None:
        stamped = self.payload.get("submitted_at")
        return float(stamped) if isinstance(stamped, int | float) else None


class RedisLists:
    """Lanes as Redis lists `{prefix}{queue}`, a lane's queue being its name unless `queues`
    (lane → queue, LANEPOOL_QUEUES) names another: producers RPUSH JSON objects, workers take
    with `BLPOP key1 key2 … timeout`, which takes from the first non-empty key: strict lane
    order."""

    def __init__(
        self,
        url: str,
        slots: int,
        key_prefix: str = DEFAULT_KEY_PREFIX,
        queues: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        self.key_prefix = key_prefix
        self._queues = dict(queues or {})
        self._lanes = {queue: lane for lane, queue in self._queues.items()}
        # A connection per slot, each blocked in its own BLPOP, so that a request can end every
        # wait at once with CLIENT UNBLOCK from the HTTP thread.
        self._idle: asyncio.Queue[AsyncRedis] = asyncio.Queue()
        for _ in range(slots):
            self._idle.put_nowait(AsyncRedis.from_url(url, single_connection_client=True))
        self._client_ids: dict[int, int] = {}
        self._blocked: set[int] = set()
        self._blocked_lock = threading.Lock()
        self._client = AsyncRedis.from_url(url)
        self._unblocker = bounded_client(connect(url), 0.1)

    def key(self, lane: str) -> str:
        return f"{self.key_prefix}{self._queues.get(lane, lane)}"

    def follow(self, state: WorkerState) -> None:
        """Ends every wait for a job when the operator's request comes."""
        state.add_listener(self.end_the_waits)

    def end_the_waits(self) -> None:
        """Ends every BLPOP now waiting (each returns nothing): at most 100 ms a connection."""
        with self._blocked_lock:
            blocked = list(self._blocked)
        for client_id in blocked:
            with contextlib.suppress(RedisError):
                self._unblocker.client_unblock(client_id)

    async def take(self, lanes: Sequence[str], timeout: float) -> ListJob | None:
        connection = await self._idle.get()
        client_id = None
        try:
            client_id = self._client_ids.get(id(connection))
            if client_id is None:
                client_id = self._client_ids[id(connection)] = await connection.client_id()
            with self._blocked_lock:
                self._blocked.add(client_id)
            taken = await connection.blpop([self.key(lane) for lane in lanes], timeout)
        except RedisError:
            self._client_ids.pop(id(connection), None)  # a new connection has a new id
            raise
        finally:
            with self._blocked_lock:
                self._blocked.discard(client_id)
            self._idle.put_nowait(connection)
        if taken is None:
            # Asked again after an empty take: a connection redis-py opened anew on its own (a
            # Redis restart) has a new id.
            self._client_ids.pop(id(connection), None)
            return None
        key = _text(taken[0])
        raw = taken[1] if isinstance(taken[1], bytes) else taken[1].encode()
        queue = key.removeprefix(self.key_prefix)
        lane = self._lanes.get(queue, queue)
        try:
            payload = json.loads(raw)
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            # Set aside, never dropped: a producer's bug is found there.
            await self._client.rpush(f"{key}:unreadable", raw)
            log.error(
                "a %s job is not a JSON object (%s), set aside in %s:unreadable", lane, e, key
            )
            return None
        return ListJob(lane, payload, raw)

    async def give_back(self, job: ListJob) -> None:
        await self._client.lpush(self.key(job.lane), job.raw)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def load_handler(spec: str) -> Callable[[dict[str, Any]], Any]:
    """`module:function` → the function."""
    module_name, _, function_name = spec.partition(":")
    if not module_name or not function_name:
        raise ValueError(f"--handler {spec!r}: expected module:function")
    handler = getattr(importlib.import_module(module_name), function_name)
    if not callable(handler):
        raise ValueError(f"--handler {spec!r} is not a function")
    return handler  # type: ignore[no-any-return]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lanepool-redis-worker",
        description="A worker for jobs in Redis lists (one per lane, JSON objects): takes the "
        "lanes of LANEPOOL_LANES in order (each lane's list named as the lane unless "
        "LANEPOOL_QUEUES names another), runs LANEPOOL_SLOTS jobs at once with the handler, "
        "serves /metrics, POST /drain and POST /stand-in at LANEPOOL_METRICS_ADDR.",
    )
    parser.add_argument(
        "--url",
        default=os.environ.get(REDIS_URL_ENV, DEFAULT_REDIS_URL),
        help=f"Redis URL (default: ${REDIS_URL_ENV} or {DEFAULT_REDIS_URL})",
    )
    parser.add_argument(
        "--handler",
        required=False,
        help="module:function run with each job's JSON object (async or not)",
    )
    parser.add_argument(
        "--key-prefix",
        default=DEFAULT_KEY_PREFIX,
        help=f"a lane's list is PREFIX+queue, its queue its name unless LANEPOOL_QUEUES "
        f"names another (default {DEFAULT_KEY_PREFIX})",
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        help="a directory to import the handler from (repeatable; default .)",
    )
    args = parser.parse_args(argv)  # fmt: skip

    try:
        config = config_from_env()
    except ConfigError as e:
        print(f"lanepool-redis-worker: error: {e}", file=sys.stderr)
        return 2
    for path in reversed(args.path or ["."]):
        sys.path.insert(0, os.path.abspath(path))
    try:
        handler = load_handler(args.handler or "")
    except (ValueError, ImportError, AttributeError) as e:
        print(f"lanepool-redis-worker: error: {e}", file=sys.stderr)
        return 2
    setup_logging()
    state = WorkerState(config)
    keys = {lane: f"{args.key_prefix}{config.queue(lane)}" for lane in config.lanes}
    state.registry.register(QueueDepth(connect(args.url), keys))
    metrics = "off"
    if config.metrics_addr is not None:
        host, port = serve(state, config.metrics_addr).address
        metrics = f"http://{f'[{host}]' if ':' in host else host}:{port}/metrics"
    log.info("%s: %s worker of pool %s, lanes %s (in this order), %d slots, metrics %s",
             config.name, config.role, config.pool, config.lanes_shown(), config.slots,
             metrics)  # fmt: skip
    if config.metrics_addr is not None and config.credential_file is None:
        log.warning("%s", unset_note(config.name))
    asyncio.run(_serve_lists(args.url, args.key_prefix, handler, state))
    log.info("%s: stopped, no job in hand", config.name)
    return 0


async def _serve_lists(
    url: str, key_prefix: str, handler: Callable[[dict[str, Any]], Any], state: WorkerState
) -> None:
    loop = asyncio.get_running_loop()
    # A plain function runs on a thread of its own, one per slot, so it never blocks the loop.
    loop.set_default_executor(ThreadPoolExecutor(max_workers=state.config.slots))
    queue = RedisLists(url, state.config.slots, key_prefix, dict(state.config.queues))
    queue.follow(state)
    stop = asyncio.Event()

    def stopping() -> None:
        stop.set()
        queue.end_the_waits()  # idle slots stop at once, busy ones finish their job

    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stopping)
    pause = _Pause(stop)

    async def take(lanes: Sequence[str], timeout: float) -> ListJob | None:
        try:
            job = await queue.take(lanes, timeout)
        except RedisError as e:
            await pause.after_error(state.config.name, e)
            return None
        pause.reset()
        return job

    async def run(job: ListJob) -> None:
        if inspect.iscoroutinefunction(handler):
            await handler(job.payload)
        else:
            await loop.run_in_executor(None, handler, job.payload)

    await run_worker(take, run, state, give_back=queue.give_back, stop=stop)


class _Pause:
    """Waits longer after each failed take, 1 s doubling to 30 s, or until SIGTERM: a Redis that
    is down is asked again, not hammered."""

    def __init__(self, stop: asyncio.Event) -> None:
        self._stop = stop
        self._seconds = 1.0

    async def after_error(self, name: str, error: Exception) -> None:
        log.error("%s: Redis unreachable: %s; trying again in %.0f s", name, error, self._seconds)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), self._seconds)
        self._seconds = min(self._seconds * 2, 30.0)

    def reset(self) -> None:
        self._seconds = 1.0


if __name__ == "__main__":
    sys.exit(main())
