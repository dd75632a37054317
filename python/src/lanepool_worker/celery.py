"""Celery adapter: `configure(app)` makes `celery -A app worker` take its lanes in strict order
(each lane's queue named as the lane unless LANEPOOL_QUEUES names another), one job per slot,
count job time, wait and busy slots in the worker's main process, serve the metrics port, and
drain and stand in through its own consumer; without LANEPOOL_LANES (outside a LanePool) the
worker runs as plain Celery. It must never start anything outside a worker's main process
(producers import the same app), nor send a drain to another worker, nor hand a job to a slot
without being busy with it in the same step as it checks for a drain.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any

from celery import Celery, bootsteps, signals
from celery.exceptions import TaskRevokedError
from celery.worker import state as celery_state
from celery.worker.consumer import Consumer
from celery.worker.request import Request
from celery.worker.worker import WorkController

from .config import ConfigError, config_from_env, why_off
from .credential import unset_note
from .producer import SUBMITTED_AT
from .server import ServingThread, serve
from .state import Job, WorkerState

log = logging.getLogger("lanepool_worker")
# How long the lane keeper sleeps when nothing changes (requests and lapses wake it at once): a
# switch that failed is tried again after at most this.
_IDLE_CHECK = 5.0


def configure(app: Celery, environ: Mapping[str, str] = os.environ) -> WorkerState | None:
    """Sets what lanepool needs on `app` and, once `celery worker` starts, runs its side of the
    protocol. Call it in the module `-A` names; a configuration loaded later
    (`config_from_object`) gets the same settings again.

    Returns the worker's state, or None where `LANEPOOL_LANES` is unset or empty (a producer
    importing the app, or a `celery worker` outside a LanePool, such as on a laptop): there
    lanepool is off. It only sets the settings, and a `celery worker` runs as plain Celery (its
    own `-Q` and `-c`, no metrics port, drains or stand-ins) and says so in one warning at start.
    A `LANEPOOL_LANES` with a value is the operator's: a malformed one, or a missing or malformed
    `LANEPOOL_*` beside it, raises `ConfigError` naming the variable.
    """
    if getattr(app, "_lanepool_configured", False):
        # Configured already: one metrics port, one set of hooks, one warning.
        configured: WorkerState | None = getattr(app, "_lanepool_state", None)
        return configured
    off = why_off(environ)
    if off is not None:
        _keep_settings(app, slots=None)
        signals.celeryd_after_setup.connect(_say_off(app, off), weak=False)
        app._lanepool_configured = True
        return None
    config = config_from_env(environ)
    _keep_settings(app, slots=config.slots)
    state = WorkerState(config)
    _CeleryWorker(app, state).connect()
    app._lanepool_state = state
    app._lanepool_configured = True
    return state


def _keep_settings(app: Celery, slots: int | None) -> None:
    settings = _settings(slots)
    # Celery replaces its whole configuration at each `config_from_object`, and tasks take
    # `acks_late` from it when the app is finalized: set again after every load.
    app.on_after_configure.connect(settings, weak=False)
    if app.configured:
        settings(source=app.conf)


def _settings(slots: int | None) -> Callable[..., None]:
    def set_on(source: Any, **_: Any) -> None:
        # Kombu's Redis transport polls the consumed queues round-robin by default: urgent
        # would wait behind a batch job for every urgent one. "priority" asks BRPOP for them in
        # order.
        source["broker_transport_options"] = {
            **(source.get("broker_transport_options") or {}),
            "queue_order_strategy": "priority",
        }
        # One message per slot: a prefetched job would wait behind the one in hand while
        # another worker idles, and a drained worker would hold it. Late acks keep a job in the
        # queue's unacked set until it ends: a warm shutdown puts what it holds back at the head
        # of its lane, and a worker killed mid-job gives its job back after the visibility
        # timeout (1 h unless `broker_transport_options["visibility_timeout"]` says otherwise;
        # keep it above the longest job, or a job still running is handed to a second worker).
        source["worker_prefetch_multiplier"] = 1
        source["task_acks_late"] = True
        # Celery 6 turns this on: a Redis blip would then cancel every job in hand (cut short,
        # run again). Off, they run to the end; one whose ack is lost with the connection runs
        # again after the visibility timeout (at least once either way, but never cut short).
        source["worker_cancel_long_running_tasks_on_connection_loss"] = False
        if slots is not None:
            source["worker_concurrency"] = slots

    return set_on


def _say_off(app: Celery, off: str) -> Callable[..., None]:
    def say(sender: str, instance: WorkController, **_: Any) -> None:
        # `celeryd_after_setup`: `celery worker`'s main process only, once its logging is set up
        # and before it connects (a laptop without a broker still sees why). A warning, so that
        # Celery's default log level shows it.
        if instance.app is app:
            log.warning(
                "lanepool is off (%s; the operator sets it in a LanePool's workers): plain "
                "Celery, with Celery's own queues and concurrency and no metrics port, drains "
                "or stand-ins",
                off,
            )

    return say


class _CeleryWorker:
    """lanepool's side of one `celery worker`, wired through Celery's signals."""

    def __init__(self, app: Celery, state: WorkerState) -> None:
        self.app = app
        self.state = state
        self.serving: ServingThread | None = None
        self._worker: WorkController | None = None
        self._taking: list[str] | None = None  # the lanes last handed to the consumer
        self._changed = threading.Event()  # set by every accepted request
        self._notes: list[str] = []

    def connect(self) -> None:
        # Celery keeps receivers weakly by default; these live as long as the app.
        signals.worker_init.connect(self._on_worker_init, weak=False)
        signals.worker_ready.connect(self._on_worker_ready, weak=False)
        signals.task_received.connect(self._on_task_received, weak=False)
        self.app.steps["consumer"].add(self._gate_step())

    def _gate_step(self) -> type[bootsteps.StartStopStep]:
        gate = self

        class LaneGate(bootsteps.StartStopStep):  # type: ignore[misc]
            """Consumer step (main process): hands back what the lanes to take exclude."""

            requires = ("celery.worker.consumer.tasks:Tasks",)

            def start(self, parent: Consumer) -> None:
                gate._guard(parent)

        return LaneGate

    # -- start ---------------------------------------------------------------------------------

    def _on_worker_init(self, sender: WorkController, **_: Any) -> None:
        """In `celery worker`'s main process, after `-Q` and `-c` are read, before the pool and
        the consumer start (prefork children never see this signal)."""
        if sender.app is not self.app:
            return
        try:
            self._start(sender)
        except Exception as error:
            # Celery logs and swallows an Exception raised by a signal receiver: a worker whose
            # metrics port cannot open would run unseen by the operator.
            raise SystemExit(f"lanepool: {self.state.config.name}: {error}") from error

    def _start(self, sender: WorkController) -> None:
        config = self.state.config
        name = config.name
        # Celery sets its logging up after this signal: what is said here waits for worker_ready.
        notes = self._notes
        if sender.concurrency != config.slots:
            # The operator sizes the pool by LANEPOOL_SLOTS: a worker running more jobs than
            # that takes jobs the sizing does not know of; fewer leaves a lane short.
            notes.append(
                f"{name}: concurrency {sender.concurrency} set to LANEPOOL_SLOTS={config.slots}"
            )
            sender.concurrency = config.slots
        if sender.prefetch_multiplier != 1:
            notes.append(
                f"{name}: --prefetch-multiplier {sender.prefetch_multiplier} set back to 1: a "
                "worker holds no job it does not run"
            )
            sender.prefetch_multiplier = 1
        # A task whose own `acks_late=False` overrides the configuration is its author's choice.
        tasks = sorted(self.app.tasks.items())
        early = [n for n, task in tasks if not task.acks_late and not n.startswith("celery.")]
        if early:
            notes.append(
                f"{name}: tasks {','.join(early)} acknowledge their message at start (acks_late "
                "off): one cut short by a stopped worker is lost"
            )
        queues = self.app.amqp.queues
        selected = list(queues.consume_from)  # every queue of the app when no -Q selected any
        if selected != self._queues_of(config.lanes) and set(selected) != set(queues):
            notes.append(f"{name}: -Q {','.join(selected)} replaced by LANEPOOL_LANES")
        # Selected in order, as `-Q urgent,batch` does: the priority strategy asks BRPOP for the
        # queues in the consumer's order.
        self._taking = self.state.lanes_to_take()
        _select(queues, self._queues_of(self._taking))
        self._worker = sender
        if config.metrics_addr is not None:
            self.serving = serve(self.state, config.metrics_addr)
            if config.credential_file is None:
                notes.append(unset_note(name))
        self.state.add_listener(self._changed.set)
        threading.Thread(target=self._keep_lanes, name="lanepool-lanes", daemon=True).start()

    def _on_worker_ready(self, sender: Consumer, **_: Any) -> None:
        if sender.app is not self.app:
            return
        config = self.state.config
        log.info(
            "%s: %s worker of pool %s, lanes %s (in this order), %d slots, metrics %s",
            config.name,
            config.role,
            config.pool,
            config.lanes_shown(),
            config.slots,
            "{}:{}".format(*self.serving.address) if self.serving is not None else "off",
        )
        for note in self._notes:
            log.warning("%s", note)
        self._notes.clear()

    # -- lanes: drain and stand-in -------------------------------------------------------------

    def _keep_lanes(self) -> None:
        """Hands every change of the lanes to take (a request, or a drain or stand-in lapsing)
        to the consumer's own thread, which alone may touch its queues."""
        while True:
            lapse = self.state.next_change_in()
            # Just past a lapse, so that the lanes read next are those after it.
            self._changed.wait(_IDLE_CHECK if lapse is None else min(_IDLE_CHECK, lapse + 0.01))
            # Cleared before the lanes are read: a request that comes after is seen next time.
            self._changed.clear()
            wanted = self.state.lanes_to_take()
            consumer = self._consumer()
            if wanted == self._taking or consumer is None:
                continue
            self._taking = wanted
            # call_soon is how Celery's own add_consumer/cancel_consumer reach the consumer:
            # the event loop runs it before its next fetch (and is woken for it), the blocking
            # loop before its next drain_events. The order of two such calls is not guaranteed,
            # so the switch reads the lanes when it runs rather than carrying them.
            consumer.call_soon(self._switch_lanes)

    def _guard(self, consumer: Consumer) -> None:
        """Wraps the consumer's message handler, which the event loop builds at each (re)start.

        The consumer's BRPOP in flight (up to kombu's 1 s) still names the lanes it was sent
        with, and the switch reaches the consumer's thread after the request's answer: a job the
        queue hands out in between would run on a drained worker. The protocol's answer: it goes
        back to its lane (`reject(requeue=True)`: kombu puts it at the end of the lane, as it
        does with a message for a queue it no longer consumes)."""
        if getattr(consumer, "_lanepool_guarded", False):
            return
        create_task_handler = consumer.create_task_handler

        def create_guarded_handler(*args: Any, **kwargs: Any) -> Callable[[Any], Any]:
            on_task_received = create_task_handler(*args, **kwargs)

            def on_message(message: Any) -> Any:
                lane = self._lane_from(message.delivery_info or {})
                if self._hands_back(lane):
                    log.info(
                        "%s: lane %s job handed back: not taking it", self.state.config.name, lane
                    )
                    message.reject(requeue=True)
                    return None
                return on_task_received(message)

            return on_message

        consumer.create_task_handler = create_guarded_handler
        consumer._lanepool_guarded = True

    def _hands_back(self, lane: str) -> bool:
        wanted = self.state.lanes_to_take()
        if not wanted:
            return True  # draining
        # Standing in: the own lanes wait. A lane that maps to none of them (a routing key no
        # queue of the app names) is taken: handing it back could go on forever.
        return lane not in wanted and lane in self.state.config.lanes

    def _consumer(self) -> Consumer | None:
        worker = self._worker
        return getattr(worker, "consumer", None) if worker is not None else None

    def _switch_lanes(self) -> None:
        """In the consumer's thread: consume exactly the lanes to take, in their order."""
        consumer = self._consumer()
        if consumer is None:
            return
        wanted = self._queues_of(self.state.lanes_to_take())
        queues = self.app.amqp.queues
        consumed = list(queues.consume_from)
        # Kombu appends an added queue after the others, and the priority strategy polls them in
        # that order: a lane that must come first again means cancelling every lane after it.
        kept = 0
        while kept < min(len(consumed), len(wanted)) and consumed[kept] == wanted[kept]:
            kept += 1
        try:
            if consumer.task_consumer is None:
                # Between a lost connection and its retry: the new task consumer is built from
                # the selection.
                _select(queues, wanted)
                return
            for queue in consumed[kept:]:
                consumer.cancel_task_queue(queue)
            for queue in wanted[kept:]:
                # A lane the app does not know is declared as Celery declares a missing queue
                # (a direct exchange and routing key of its name), where `apply_async(queue=)`
                # publishes.
                consumer.add_task_queue(queue)
        except Exception:
            # The event loop must not die of it; the keeper tries again within _IDLE_CHECK.
            log.exception("%s: could not switch to queues %s", self.state.config.name, wanted)
            self._taking = None

    # -- jobs ----------------------------------------------------------------------------------

    def _on_task_received(self, sender: Consumer, request: Request, **_: Any) -> None:
        """In the main process, for every job the consumer took, whatever the pool.

        Celery has no main-process signal for a job's start and end: the prefork pool fires
        `task_prerun`/`task_postrun` in the child, where a count is lost. But every job goes to
        the pool through the request's `execute_using_pool`, in the main process, and every pool
        calls the request's `on_accepted` when a slot starts the job and `on_success`/
        `on_failure`/`on_timeout` when it ends, in the main process (the threads pool: on its
        threads). The request's class is built per task by Celery without `__slots__`, so they
        can be wrapped on the instance, for every task class and pool alike.
        """
        if sender.app is not self.app:
            return
        lane = self._lane_from(request.delivery_info or {})
        track = _JobTracker(self.state, lane, _submitted_at(request), self._hands_back)
        try:
            request.execute_using_pool = track.handed_to_pool(request)
            request.on_accepted = track.accepted(request.on_accepted)
            request.on_success = track.ended(request.on_success)
            request.on_failure = track.ended(request.on_failure)
            request.on_timeout = track.timed_out(request.on_timeout)
        except AttributeError:
            log.warning("%s: cannot count job %s: its request has __slots__", sender, request.id)

    def _queues_of(self, lanes: tuple[str, ...] | list[str]) -> list[str]:
        """The Celery queues of `lanes`, in their order."""
        return [self.state.config.queue(lane) for lane in lanes]

    def _lane_from(self, info: Mapping[str, Any]) -> str:
        """The lane a message came from, by its queue: kombu's Redis transport keeps only its
        exchange and routing key, which the app's queues map back to a queue's name."""
        exchange, key = info.get("exchange") or "", info.get("routing_key") or ""
        for name, queue in self.app.amqp.queues.items():
            if queue.routing_key == key and (queue.exchange.name or "") == exchange:
                return self.state.config.lane_of(str(name))
        return self.state.config.lane_of(str(key))


class _GivenBack(TaskRevokedError):  # type: ignore[misc]
    """Raised out of `execute_using_pool` for a job given back instead of sent to the pool: the
    worker takes a TaskRevokedError from there as "not sent", as for a revoked job, and frees the
    place the prefork pool's semaphore held for it (kept otherwise, the slot would never take
    again)."""


class _JobTracker:
    """One job's hand-off to a slot, start and end as the main process sees them."""

    def __init__(
        self,
        state: WorkerState,
        lane: str,
        submitted_at: float | None,
        hands_back: Callable[[str], bool],
    ) -> None:
        self._state = state
        self._lane = lane
        self._submitted_at = submitted_at
        self._hands_back = hands_back
        self._job: Job | None = None
        self._ended = False
        self._lock = threading.Lock()

    def handed_to_pool(self, request: Request) -> Callable[..., Any]:
        """Wraps the request's `execute_using_pool`, the one way a job reaches a slot: the job is
        marked busy there, in the same locked step as the drain check (`job_taken`), or given
        back to its lane (`reject(requeue=True)`, as the consumer's gate does). A drain answered
        before that step sends the job back; one answered after sees the worker busy, though the
        prefork pool's child reports the start (`on_accepted`) only later.

        ETA and countdown jobs held in the worker's memory come here too, when the consumer's
        timer hands them to the pool: a drained worker gives them back rather than run them.
        Counting them busy while held would keep a drained worker "busy" for as long as the
        countdown (hours, for some), so its shrink would wait out the drain timeout and then stop
        it by ranking alone; given back, none runs after a drain answered idle and none is lost.
        Until its time a held job is an unacknowledged message, which kombu puts back in its
        lane when a stopped worker's connection closes (after the visibility timeout if it was
        killed); when its time comes on a drained worker, it goes back to its lane, past its ETA,
        for the next worker that takes the lane."""
        execute_using_pool = request.execute_using_pool

        def wrapped(pool: Any, *args: Any, **kwargs: Any) -> Any:
            job = self._taken()
            if job is None:
                if request.revoked():
                    # Celery's own check first (it acknowledges the message): a revoked or
                    # expired job given back would run on a worker that never heard of it.
                    raise TaskRevokedError(request.id)
                log.info(
                    "%s: lane %s job %s handed back: a drain or stand-in came before it started",
                    self._state.config.name,
                    self._lane,
                    request.id,
                )
                request.reject(requeue=True)
                # Forgotten by Celery's bookkeeping too (`inspect reserved`, `scheduled`).
                celery_state.task_ready(request)
                raise _GivenBack(request.id)
            try:
                return execute_using_pool(pool, *args, **kwargs)
            except BaseException:
                # Revoked or expired (a TaskRevokedError), or refused by the pool: never run.
                self._release(job)
                raise

        return wrapped

    def _taken(self) -> Job | None:
        """The job marked busy, or None when it goes back. The lanes are read after the request
        count and `job_taken` refuses if any request came in between, so the decision holds as
        if made under the state's lock."""
        state = self._state
        seen = state.requests_seen()
        if self._hands_back(self._lane):
            return None
        job = state.job_taken(self._lane, self._submitted_at, requests_seen=seen)
        if job is not None:
            with self._lock:
                self._job = job
        return job

    def _release(self, job: Job) -> None:
        with self._lock:
            if self._job is not job:
                return  # ended already (the solo pool runs the job inside the hand-off)
            self._job, self._ended = None, True
        self._state.job_handed_back(job)

    def accepted(self, on_accepted: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                # Busy since the hand-off. A job that reached a slot another way is busy from
                # here; an end seen first (a pool reporting out of order) must not leave a slot
                # busy.
                if self._job is None and not self._ended:
                    self._job = self._state.job_started(self._lane, self._submitted_at)
            return on_accepted(*args, **kwargs)

        return wrapped

    def ended(self, callback: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            self._end()
            return callback(*args, **kwargs)

        return wrapped

    def timed_out(self, on_timeout: Callable[..., Any]) -> Callable[..., Any]:
        def wrapped(soft: bool, timeout: float, *args: Any, **kwargs: Any) -> Any:
            if not soft:  # a soft limit only raises in the task, which goes on
                self._end()
            return on_timeout(soft, timeout, *args, **kwargs)

        return wrapped

    def _end(self) -> None:
        with self._lock:
            job, self._job, self._ended = self._job, None, True
        if job is not None:  # ended without a start: revoked or lost before a slot took it
            self._state.job_finished(job)


def _select(queues: Any, names: list[str]) -> None:
    """Consume exactly the queues `names`, in order (`Queues.select([])` would leave the
    selection as is)."""
    if names:
        queues.select(names)
    else:
        queues.deselect(list(queues.consume_from))


def _submitted_at(request: Request) -> float | None:
    # The producer's `before_task_publish` stamps it in the message's headers (Unix seconds).
    value = (request.request_dict or {}).get(SUBMITTED_AT)
    try:
        submitted_at = float(value) if value is not None else None
    except (TypeError, ValueError):
        return None
    return submitted_at if submitted_at is not None and math.isfinite(submitted_at) else None


__all__ = ["ConfigError", "configure"]
