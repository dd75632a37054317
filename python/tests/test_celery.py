"""The Celery adapter against a real redis-server and real `celery worker` processes: strict lane
order, reserved workers, drains (one landing as a job is handed to a slot, one as a countdown job
comes due), stand-ins, SIGTERM, four slots counted in the main process, the wait from the
producer's header, a Redis restart, only the pool's credential steering it, a worker outside a
LanePool running as plain Celery, and where a routed task lands. Nothing here imitates Celery or
Redis."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import celery
import pytest
from celery.signals import before_task_publish
from prometheus_client import CollectorRegistry
from redis import Redis

from lanepool_worker.celery import configure
from lanepool_worker.producer import Producer
from lanepool_worker.state import WorkerState
from processes import (
    BIN,
    Answer,
    RedisServer,
    WorkerCredential,
    exchange,
    free_port,
    http,
    said_unmounted,
    value,
    wait_until,
)
from steering import assert_refused_and_unchanged, assert_refused_unmounted, assert_unauthorized

SRC = Path(__file__).resolve().parents[1] / "src"

# The app every worker here runs: each job records its start and its end, in order.
APP = textwrap.dedent(
    """
    import os, threading, time, urllib.request
    import redis
    from celery import Celery, signals
    from celery.concurrency.prefork import TaskPool
    from lanepool_worker.celery import configure

    app = Celery("lanes", broker=os.environ["BROKER_URL"])
    configure(app)
    if os.environ.get("CONFIGURE_AGAIN"):
        configure(app)  # adds nothing: one port, one set of hooks, one line said
    if os.environ.get("CONFIGURED_AFTER"):
        # Loaded after configure(app): replaces the whole configuration.
        class Late:
            worker_prefetch_multiplier = 4
            broker_transport_options = {"visibility_timeout": 600}

        app.config_from_object(Late)
    store = redis.Redis.from_url(os.environ["BROKER_URL"])

    def record(key, name):
        # A job outlives a Redis restart: its own writes wait for Redis to come back.
        for _ in range(100):
            try:
                return store.rpush(key, name)
            except redis.ConnectionError:
                time.sleep(0.1)

    @app.task
    def job(name, seconds):
        record("started", name)
        time.sleep(seconds)
        record("finished", name)

    drained = threading.Event()

    def drain_once():
        # The operator's POST /drain, sent from inside the worker at the moment a test chose,
        # for the first job only; its answer kept in list `answers`.
        if drained.is_set():
            return
        drained.set()
        with open(os.environ["LANEPOOL_CREDENTIAL_FILE"]) as file:
            token = file.read().strip()
        request = urllib.request.Request(
            "http://{}/drain?seconds=30".format(os.environ["LANEPOOL_METRICS_ADDR"]),
            method="POST",
            headers={"Authorization": "Bearer " + token},
        )
        with urllib.request.urlopen(request, timeout=5) as answer:
            record("answers", answer.read())

    if os.environ.get("DRAIN_AT") == "received":
        # Once the consumer took the job, before it goes to the pool.
        signals.task_received.connect(lambda **_: drain_once(), weak=False)

    class DrainingPool(TaskPool):
        # The prefork pool (`-P custom`), with the drain landing as it takes a job, before a
        # child starts it.

        def apply_async(self, *args, **kwargs):
            drain_once()
            return super().apply_async(*args, **kwargs)
    """
)


class CeleryWorker:
    """`celery -A lanes_app worker` as the operator starts it: lanepool's variables, a metrics
    port, the pool's credential (None: LANEPOOL_CREDENTIAL_FILE unset), and its log in a file.
    Outside a pool (a laptop), none of the variables the operator sets: LANEPOOL_METRICS_ADDR
    alone, left over in the shell."""

    def __init__(
        self,
        app_dir: Path,
        broker: str,
        env: dict[str, str],
        args: list[str],
        credential: WorkerCredential | None,
        outside_a_pool: bool = False,
    ) -> None:
        self.credential = credential
        self.metrics = ("127.0.0.1", free_port())
        self.log_path = app_dir / f"worker-{self.metrics[1]}.log"
        operators = {
            "LANEPOOL_POOL": "jobs",
            **(credential.env if credential is not None else {}),
        }
        environment = {
            **{name: text for name, text in os.environ.items() if not name.startswith("LANEPOOL")},
            "PYTHONPATH": os.pathsep.join([str(SRC), str(app_dir)]),
            "BROKER_URL": broker,
            "HOSTNAME": f"jobs-{self.metrics[1]}",
            "LANEPOOL_METRICS_ADDR": f"127.0.0.1:{self.metrics[1]}",
            **({} if outside_a_pool else operators),
            **env,
        }
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [
                    str(BIN / "celery"),
                    "-A",
                    "lanes_app",
                    "worker",
                    "-l",
                    "info",
                    "-n",
                    f"w{self.metrics[1]}@test",
                    *args,
                ],
                cwd=app_dir,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_ready(self) -> CeleryWorker:
        def ready() -> bool:
            assert self.process.poll() is None, f"the worker exited:\n{self.log()}"
            return " ready." in self.log()

        wait_until("the worker's ready line", ready, 20)
        return self

    def get(self) -> str:
        status, body = http(self.metrics, "GET", "/metrics")
        assert status == 200
        return body

    def post(self, path: str) -> str:
        authorization = self.credential.authorization if self.credential is not None else None
        status, body = http(self.metrics, "POST", path, authorization=authorization)
        assert status == 200, body
        return body

    def post_as(self, authorization: str | None, path: str) -> Answer:
        """A POST with this Authorization field (None: without one), answered in full."""
        return exchange(self.metrics, "POST", path, authorization=authorization)

    def stop(self, signum: int = signal.SIGTERM, within: float = 15) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
            try:
                self.process.wait(timeout=within)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()


@pytest.fixture(scope="module")
def app_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("celery-app")
    (directory / "lanes_app.py").write_text(APP)
    return directory


@pytest.fixture
def store(redis: Redis, redis_server: RedisServer) -> Iterator[Redis]:
    """The emptied Redis, read as text."""
    client = Redis(port=redis_server.port, decode_responses=True)
    yield client
    client.close()


@pytest.fixture
def start_worker(
    app_dir: Path, redis_server: RedisServer, credential: WorkerCredential
) -> Iterator[Callable[..., CeleryWorker]]:
    workers: list[CeleryWorker] = []
    pools_credential = credential

    def start(
        lanes: str = "urgent,batch",
        role: str = "shared",
        pool: str = "prefork",
        slots: int | None = None,
        extra: tuple[str, ...] = (),
        broker: str | None = None,
        app_env: dict[str, str] | None = None,
        credential: WorkerCredential | None = pools_credential,
        outside_a_pool: bool = False,
    ) -> CeleryWorker:
        """`outside_a_pool`: started as on a laptop, without LANEPOOL_LANES, LANEPOOL_ROLE,
        LANEPOOL_POOL and the credential (`lanes`, `role` and `credential` unused)."""
        operators = {} if outside_a_pool else {"LANEPOOL_LANES": lanes, "LANEPOOL_ROLE": role}
        env = {**operators, **(app_env or {})}
        if slots is not None:
            env["LANEPOOL_SLOTS"] = str(slots)
        # Mingle, gossip and heartbeats talk to other workers: there are none, and they slow a
        # start down.
        args = ["-P", pool, "--without-mingle", "--without-gossip", "--without-heartbeat", *extra]
        worker = CeleryWorker(
            app_dir, broker or redis_server.url, env, args, credential, outside_a_pool
        )
        workers.append(worker)
        return worker.wait_ready()

    yield start
    for worker in workers:
        worker.stop(signal.SIGQUIT)  # cold: the test is over, and a warm stop takes ~2 s


@pytest.fixture
def submit(redis_server: RedisServer) -> Iterator[Callable[..., None]]:
    """Sends `job(name, seconds)` to a lane as a producer does: stamped by the package's
    `before_task_publish` hook."""
    producer = Producer("ns", "jobs", registry=None)
    producer.install_celery()
    apps: dict[str, celery.Celery] = {}

    def send(
        lane: str,
        name: str,
        seconds: float,
        broker: str | None = None,
        countdown: float | None = None,
    ) -> None:
        url = broker or redis_server.url
        if url not in apps:
            apps[url] = celery.Celery("lanes", broker=url)
        apps[url].send_task("lanes_app.job", (name, seconds), queue=lane, countdown=countdown)

    yield send
    before_task_publish.disconnect(producer.before_task_publish)


def listed(store: Redis, key: str) -> list[str]:
    return list(store.lrange(key, 0, -1))


def unacked_jobs(store: Redis) -> list[str]:
    """The names of the jobs kombu holds as delivered and not acknowledged (hash `unacked`:
    message, exchange, routing key; the body is base64 JSON of args, kwargs, embed)."""
    messages = (json.loads(entry)[0] for entry in store.hvals("unacked"))
    return [json.loads(base64.b64decode(message["body"]))[0][0] for message in messages]


# -- lane order --------------------------------------------------------------------------------


def test_urgent_jobs_go_before_a_batch_backlog(store, submit, start_worker):
    for i in range(8):
        submit("batch", f"b{i}", 0.05)
    for i in range(3):
        submit("urgent", f"u{i}", 0.0)
    worker = start_worker()
    assert "shared worker of pool jobs, lanes urgent,batch (in this order), 1 slots" in worker.log()
    assert "replaced by LANEPOOL_LANES" not in worker.log()
    wait_until("the backlog worked on", lambda: len(listed(store, "started")) >= 5)
    before = len(listed(store, "started"))
    submit("urgent", "late", 0.0)  # behind a batch backlog: taken next, not after it
    wait_until("every job done", lambda: store.llen("finished") == 12, 15)
    started = listed(store, "started")
    # Kombu's default round-robin alternates: u0 b0 u1 b1 u2 ...
    assert started[:3] == ["u0", "u1", "u2"], started
    # Next, or after the one batch job that may have started as it was sent.
    assert started.index("late") in (before, before + 1), started


def test_a_configuration_loaded_after_configure_keeps_strict_order_and_one_job_per_slot(
    store, submit, start_worker
):
    for i in range(3):
        submit("batch", f"b{i}", 0.5)
    submit("urgent", "u0", 0.0)
    worker = start_worker(app_env={"CONFIGURED_AFTER": "1"}, extra=("--prefetch-multiplier", "4"))
    wait_until("a batch job started", lambda: len(listed(store, "started")) == 2)
    assert listed(store, "started") == ["u0", "b0"]
    # Prefetch 4, or acks at the start, would hold the next batch job behind the one in hand.
    assert store.llen("batch") == 2
    assert "--prefetch-multiplier 4 set back to 1" in worker.log()


def test_a_reserved_worker_never_takes_batch(store, submit, start_worker):
    for i in range(3):
        submit("batch", f"b{i}", 0.0)
    start_worker(lanes="urgent", role="reserved")
    submit("urgent", "u0", 0.0)
    submit("urgent", "u1", 0.0)
    wait_until("the urgent jobs done", lambda: store.llen("finished") == 2)
    time.sleep(1.5)  # longer than kombu's 1 s BRPOP: a batch job would have been taken by now
    assert listed(store, "started") == ["u0", "u1"]
    assert store.llen("batch") == 3


# -- drain -------------------------------------------------------------------------------------


def test_a_drain_takes_no_new_job_after_the_one_in_hand(store, submit, start_worker):
    worker = start_worker()
    for i in range(3):
        submit("batch", f"b{i}", 1.0)
    wait_until("the first job started", lambda: listed(store, "started") == ["b0"])
    answer = worker.post("/drain?seconds=60")
    assert value(answer, "lanepool_worker_draining") == 1
    assert value(answer, "lanepool_worker_busy", lane="batch") == 1
    wait_until("the job in hand done", lambda: listed(store, "finished") == ["b0"])
    time.sleep(2.0)
    assert listed(store, "started") == ["b0"], "a drained worker took a new job"
    metrics = worker.get()
    assert value(metrics, "lanepool_worker_busy") == 0
    assert value(metrics, "lanepool_job_duration_seconds_count", lane="batch") == 1
    # Prefetch 1 and late acks: nothing reserved behind the job in hand.
    assert store.llen("batch") == 2 and store.hlen("unacked") == 0

    called_off = time.monotonic()
    assert value(worker.post("/drain?seconds=0"), "lanepool_worker_draining") == 0
    wait_until("seconds=0 resuming", lambda: len(listed(store, "started")) == 2, 5)
    assert time.monotonic() - called_off < 2.5
    assert listed(store, "started") == ["b0", "b1"]


def test_a_drain_while_idle_hands_back_a_job_fetched_then_and_lapses(store, submit, start_worker):
    worker = start_worker(pool="solo")
    time.sleep(0.3)  # the consumer's BRPOP on both lanes is in flight
    drained = time.monotonic()
    worker.post("/drain?seconds=3")
    submit("urgent", "u0", 0.0)
    time.sleep(2.0)
    # A job the BRPOP in flight took went back to its lane.
    assert listed(store, "started") == []
    assert store.llen("urgent") == 1
    wait_until("the drain lapsing", lambda: listed(store, "finished") == ["u0"], 5)
    assert time.monotonic() - drained >= 3


HANDED_BACK = "handed back: a drain or stand-in came before it started"


def test_a_drain_before_the_hand_off_to_a_slot_sends_the_job_back_to_its_lane(
    store, submit, start_worker
):
    # The drain lands after the consumer's gate let the job in, before the pool has it.
    worker = start_worker(app_env={"DRAIN_AT": "received"})
    submit("batch", "b0", 0.0)
    wait_until("the drain answered", lambda: store.llen("answers") == 1)
    answer = listed(store, "answers")[0]
    assert value(answer, "lanepool_worker_draining") == 1
    assert value(answer, "lanepool_worker_busy") == 0
    wait_until(
        "the job back in its lane or started",
        lambda: store.llen("batch") == 1 or listed(store, "started"),
        5,
    )
    time.sleep(1.0)
    assert listed(store, "started") == [], "a job started after the drain answered idle"
    assert store.llen("batch") == 1 and store.hlen("unacked") == 0
    assert HANDED_BACK in worker.log()
    # The slot it held is free again: called off, the drain lets the same worker run it.
    worker.post("/drain?seconds=0")
    wait_until("the job run once the drain is over", lambda: listed(store, "finished") == ["b0"])
    assert listed(store, "started") == ["b0"]
    assert value(worker.get(), "lanepool_job_duration_seconds_count", lane="batch") == 1


def test_a_drain_as_the_pool_takes_the_job_sees_the_worker_busy(store, submit, start_worker):
    # The prefork child reports the start later still: the job is busy from the hand-off on.
    worker = start_worker(
        pool="custom", app_env={"CELERY_CUSTOM_WORKER_POOL": "lanes_app:DrainingPool"}
    )
    submit("batch", "b0", 0.5)
    submit("batch", "b1", 0.0)
    wait_until("the drain answered", lambda: store.llen("answers") == 1)
    answer = listed(store, "answers")[0]
    assert value(answer, "lanepool_worker_draining") == 1
    assert value(answer, "lanepool_worker_busy", lane="batch") == 1, (
        "the drain answered idle for a job handed to a slot"
    )
    wait_until("the job in hand done", lambda: listed(store, "finished") == ["b0"])
    wait_until("idle once it is done", lambda: value(worker.get(), "lanepool_worker_busy") == 0)
    time.sleep(1.5)
    assert listed(store, "started") == ["b0"], "a drained worker took a new job"
    assert store.llen("batch") == 1
    assert value(worker.get(), "lanepool_job_duration_seconds_count", lane="batch") == 1


def held_for_its_countdown(worker: CeleryWorker) -> Callable[[], bool]:
    """The worker's one job taken by the consumer: logged just before it goes to the timer."""
    return lambda: (
        re.search(r"Task lanes_app\.job\[[-0-9a-f]+\] received", worker.log()) is not None
    )


@pytest.mark.parametrize("pool", ["prefork", "threads"])
def test_a_countdown_job_due_on_a_drained_worker_goes_back_to_its_lane(
    store, submit, start_worker, pool
):
    worker = start_worker(pool=pool)
    submit("batch", "e0", 0.0, countdown=2.0)
    wait_until("the job held for its countdown", held_for_its_countdown(worker))
    answer = worker.post("/drain?seconds=60")
    # Held in memory, not running, and it will not run here: idle is the truth.
    assert value(answer, "lanepool_worker_busy") == 0
    assert store.hlen("unacked") == 1 and store.llen("batch") == 0
    wait_until(
        "the countdown over",
        lambda: HANDED_BACK in worker.log() or listed(store, "started"),
        5,
    )
    time.sleep(0.5)
    assert listed(store, "started") == [], "a countdown job started on a drained worker"
    wait_until(
        "the job back in its lane",
        lambda: store.llen("batch") == 1 and store.hlen("unacked") == 0,
        3,
    )
    assert value(worker.get(), "lanepool_worker_busy") == 0
    worker.post("/drain?seconds=0")
    wait_until("the job run once the drain is over", lambda: listed(store, "finished") == ["e0"])
    assert listed(store, "started") == ["e0"]


def test_a_drained_worker_stopped_while_holding_a_countdown_job_puts_it_back(
    store, submit, start_worker
):
    worker = start_worker()
    submit("batch", "e0", 0.0, countdown=60.0)
    wait_until("the job held for its countdown", held_for_its_countdown(worker))
    assert value(worker.post("/drain?seconds=60"), "lanepool_worker_busy") == 0
    assert worker.stop(signal.SIGTERM) == 0
    assert listed(store, "started") == []
    assert store.llen("batch") == 1 and store.hlen("unacked") == 0


# -- stand-in ----------------------------------------------------------------------------------


def test_a_stand_in_takes_only_the_asked_lanes_and_lapses(store, submit, start_worker):
    worker = start_worker()
    asked = time.monotonic()
    assert value(worker.post("/stand-in?lanes=urgent&seconds=3"), "lanepool_worker_standing_in")
    submit("batch", "b0", 0.0)
    submit("urgent", "u0", 0.0)
    wait_until("the asked lane served", lambda: listed(store, "finished") == ["u0"])
    time.sleep(max(0.0, 2.5 - (time.monotonic() - asked)))
    assert listed(store, "started") == ["u0"], "a stand-in took a lane it was not asked for"
    wait_until("the own lanes after the lapse", lambda: "b0" in listed(store, "finished"), 5)
    assert time.monotonic() - asked >= 3
    assert value(worker.get(), "lanepool_worker_standing_in") == 0


def test_the_lane_order_holds_after_a_stand_in_for_the_later_lane(store, submit, start_worker):
    worker = start_worker()
    worker.post("/stand-in?lanes=batch&seconds=1")
    # Kombu appends a queue consumed again after the others: urgent, added back alone, would
    # come after batch.
    wait_until("the stand-in over", lambda: "lanes urgent,batch again" in worker.log(), 5)
    submit("batch", "hold", 1.0)
    wait_until("the worker busy", lambda: listed(store, "started") == ["hold"], 5)
    for i in range(3):
        submit("batch", f"b{i}", 0.0)
    submit("urgent", "u0", 0.0)
    wait_until("every job done", lambda: store.llen("finished") == 5, 5)
    assert listed(store, "started")[:2] == ["hold", "u0"], listed(store, "started")


def test_a_stand_in_for_a_lane_the_app_does_not_know_consumes_that_queue(
    store, submit, start_worker
):
    # A stand-in names only the worker's own lanes: `reports`, one of them, is in no task_queues.
    worker = start_worker(lanes="urgent,reports")
    worker.post("/stand-in?lanes=reports&seconds=2")
    submit("urgent", "u0", 0.0)
    submit("reports", "r0", 0.0)
    # `reports` is in no task_queues: consumed as the queue `apply_async(queue=...)` fills.
    wait_until("the unknown lane served", lambda: listed(store, "finished") == ["r0"])
    assert store.llen("urgent") == 1
    wait_until("its own lane after the stand-in", lambda: "u0" in listed(store, "finished"), 5)
    assert worker.process.poll() is None
    assert "Started consuming from reports" in worker.log()


def test_a_lane_takes_the_celery_queue_lanepool_queues_names_and_reports_it_under_the_lane(
    store, submit, start_worker
):
    for i in range(4):
        submit("batch", f"b{i}", 0.05)
    for i in range(3):
        submit("high_priority", f"u{i}", 0.0)  # apply_async(queue="high_priority")
    submit("urgent", "stray", 0.0)  # a queue of the lane's name, which no lane of the pool takes
    worker = start_worker(app_env={"LANEPOOL_QUEUES": "urgent=high_priority"})
    log = worker.log()
    assert "lanes urgent (queue high_priority),batch (in this order)" in log
    assert "replaced by LANEPOOL_LANES" not in log
    wait_until("every job of the lanes done", lambda: store.llen("finished") == 7, 15)
    assert listed(store, "started")[:3] == ["u0", "u1", "u2"], listed(store, "started")
    assert store.llen("urgent") == 1
    text = worker.get()
    assert value(text, "lanepool_job_duration_seconds_count", lane="urgent") == 3
    assert value(text, "lanepool_job_wait_seconds_count", lane="urgent") == 3
    assert value(text, "lanepool_job_duration_seconds_count", lane="batch") == 4
    assert "high_priority" not in text

    # A stand-in names the lane; the worker consumes its queue alone.
    worker.post("/stand-in?lanes=urgent&seconds=30")
    submit("batch", "b4", 0.0)
    submit("high_priority", "u3", 0.0)
    wait_until("the lane's job", lambda: "u3" in listed(store, "finished"), 5)
    time.sleep(0.5)
    assert "b4" not in listed(store, "started") and store.llen("batch") == 1
    assert value(worker.get(), "lanepool_job_duration_seconds_count", lane="urgent") == 4


def test_the_consumer_hands_back_by_lane_what_came_from_its_queue():
    state, deliver, taken = consumer_gate({"LANEPOOL_QUEUES": "urgent=high_priority"})
    state.stand_in(["urgent"], 60)
    assert deliver("high_priority") is None
    assert deliver("batch") is True
    state.stand_in(["batch"], 60)
    assert deliver("high_priority") is True
    assert taken == ["high_priority"]


# -- SIGTERM -----------------------------------------------------------------------------------


def test_sigterm_during_a_job_finishes_it_and_leaves_the_next_queued(store, submit, start_worker):
    worker = start_worker()
    submit("batch", "b0", 1.5)
    submit("batch", "b1", 0.0)
    wait_until("the job started", lambda: listed(store, "started") == ["b0"])
    time.sleep(0.3)
    assert worker.stop(signal.SIGTERM) == 0
    assert listed(store, "finished") == ["b0"]
    assert listed(store, "started") == ["b0"]
    assert store.llen("batch") == 1, "the queued job is in its lane, not held by the worker"
    assert store.hlen("unacked") == 0


# -- slots -------------------------------------------------------------------------------------


def test_four_slots_run_four_jobs_counted_in_the_main_process(store, submit, start_worker):
    # `-c 2` on the command line loses to LANEPOOL_SLOTS: the operator sizes by slots.
    worker = start_worker(slots=4, extra=("-c", "2"))
    for i in range(4):
        submit("batch", f"b{i}", 1.5)
    wait_until(
        "four slots busy", lambda: value(worker.get(), "lanepool_worker_busy", lane="batch") == 4, 5
    )
    wait_until("the four jobs done", lambda: store.llen("finished") == 4, 5)
    wait_until("idle again", lambda: value(worker.get(), "lanepool_worker_busy") == 0, 2)
    metrics = worker.get()
    # The jobs ran in prefork children: counted at all means counted in the main process.
    assert value(metrics, "lanepool_job_duration_seconds_count", lane="batch") == 4
    assert 6.0 <= value(metrics, "lanepool_job_duration_seconds_sum", lane="batch") < 7.5
    assert value(metrics, "lanepool_worker_slots") == 4
    assert "concurrency 2 set to LANEPOOL_SLOTS=4" in worker.log()


@pytest.mark.parametrize("pool", ["solo", "threads"])
def test_other_pools_count_busy_slots_and_drain(store, submit, start_worker, pool):
    slots = 1 if pool == "solo" else 2
    worker = start_worker(pool=pool, slots=slots)
    for i in range(slots + 1):
        submit("batch", f"b{i}", 1.0)
    wait_until("every slot busy", lambda: len(listed(store, "started")) == slots)
    answer = worker.post("/drain?seconds=60")
    assert value(answer, "lanepool_worker_busy", lane="batch") == slots
    wait_until("the jobs in hand done", lambda: store.llen("finished") == slots)
    time.sleep(1.5)
    assert len(listed(store, "started")) == slots, "a drained worker took a new job"
    metrics = worker.get()
    assert value(metrics, "lanepool_job_duration_seconds_count", lane="batch") == slots
    assert value(metrics, "lanepool_worker_busy") == 0


# -- wait --------------------------------------------------------------------------------------


def test_the_wait_runs_from_the_submission_header(store, submit, start_worker):
    worker = start_worker()
    submit("urgent", "u0", 1.0)
    submit("urgent", "u1", 0.0)  # waits for u0's second
    wait_until("both done", lambda: store.llen("finished") == 2)
    metrics = worker.get()
    assert value(metrics, "lanepool_job_wait_seconds_count", lane="urgent") == 2
    # The worker was idle at the first submission: nearly all of the wait is u1's.
    assert 1.0 <= value(metrics, "lanepool_job_wait_seconds_sum", lane="urgent") < 1.5
    assert value(metrics, "lanepool_job_wait_seconds_count", lane="batch") == 0


# -- the broker --------------------------------------------------------------------------------


def test_redis_restarted_mid_run_loses_no_job(submit, start_worker, durable_redis):
    worker = start_worker(broker=durable_redis.url)
    names = [f"b{i}" for i in range(20)]
    for name in names:
        submit("batch", name, 0.1, broker=durable_redis.url)
    store = Redis(port=durable_redis.port, decode_responses=True)
    wait_until("jobs running", lambda: store.llen("finished") >= 5)
    durable_redis.stop()  # SIGTERM, as a restarted Redis Pod gets it
    time.sleep(1.0)
    durable_redis.start()
    wait_until("every job done", lambda: set(names) <= set(listed(store, "finished")), 20)
    # Left unacknowledged, at most: a job in hand that ended while Redis was away, whose ack
    # was lost with the connection. It runs again after the visibility timeout (at least once).
    unacked = unacked_jobs(store)
    assert len(unacked) <= 1 and set(unacked) <= set(listed(store, "finished"))
    assert worker.process.poll() is None
    assert worker.log().count("Connected to redis://") == 2


# -- configuration -----------------------------------------------------------------------------


def test_configure_sets_strict_order_one_job_per_slot_and_late_acks():
    app = celery.Celery("settings", broker="redis://127.0.0.1:1/0")
    app.conf.broker_transport_options = {"visibility_timeout": 7200}
    environ = {
        "LANEPOOL_LANES": "urgent,batch",
        "LANEPOOL_ROLE": "shared",
        "LANEPOOL_POOL": "jobs",
        "LANEPOOL_SLOTS": "3",
        "LANEPOOL_METRICS_ADDR": "off",
    }
    state = configure(app, environ)
    assert state is not None and state.config.lanes == ("urgent", "batch")
    assert app.conf.broker_transport_options == {
        "visibility_timeout": 7200,
        "queue_order_strategy": "priority",
    }
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.task_acks_late is True
    assert app.conf.worker_concurrency == 3
    assert app.conf.worker_cancel_long_running_tasks_on_connection_loss is False
    assert configure(app, environ) is state, "a second call adds no second port nor hooks"


class Delivered:
    """A message as kombu hands it to the consumer's handler: where it came from, and reject."""

    def __init__(self, lane: str) -> None:
        self.delivery_info = {"exchange": lane, "routing_key": lane}
        self.requeued: bool | None = None

    def reject(self, requeue: bool = False) -> None:
        self.requeued = requeue


def consumer_gate(
    more: dict[str, str],
) -> tuple[WorkerState, Callable[[str], bool | None], list[str]]:
    """A shared worker's consumer step that configure() adds, for lanes urgent and batch and
    `more` of the environment: its state, a `deliver(queue)` that hands it a message and says
    whether it was handed back (requeued), and the queues of the messages it took."""
    app = celery.Celery("gate", broker="redis://127.0.0.1:1/0")
    environ = {
        "LANEPOOL_LANES": "urgent,batch",
        "LANEPOOL_ROLE": "shared",
        "LANEPOOL_POOL": "jobs",
        "LANEPOOL_METRICS_ADDR": "off",
        **more,
    }
    state = configure(app, environ)
    assert state is not None
    (step,) = [s for s in app.steps["consumer"] if s.__name__ == "LaneGate"]
    taken: list[str] = []

    class Consumer:
        def create_task_handler(self) -> Callable[[Delivered], None]:
            return lambda message: taken.append(message.delivery_info["routing_key"])

    consumer = Consumer()
    step(consumer).start(consumer)
    handle = consumer.create_task_handler()

    def deliver(queue: str) -> bool | None:
        message = Delivered(queue)
        handle(message)
        return message.requeued

    return state, deliver, taken


def test_the_consumer_hands_back_what_a_drain_or_stand_in_excludes():
    # The race it closes (a BRPOP in flight returning just after the request) is rare, so its
    # rule is checked here directly, through the consumer step configure() adds.
    state, deliver, taken = consumer_gate({})
    assert deliver("batch") is None
    state.drain(60)
    assert deliver("urgent") is True
    state.drain(0)
    state.stand_in(["urgent"], 60)
    assert deliver("batch") is True
    assert deliver("urgent") is None
    # A routing key no lane of the worker names is taken: handing it back could go on forever.
    assert deliver("reports") is None
    assert taken == ["batch", "urgent", "reports"]


# -- outside a LanePool -------------------------------------------------------------------------

# Logged by Celery as a warning in the main process: its default level (WARNING) shows it.
SAID_OFF = (
    "WARNING/MainProcess] lanepool is off (LANEPOOL_LANES is not set; the operator sets it in a "
    "LanePool's workers): plain Celery"
)


def test_a_worker_without_lanepool_lanes_runs_as_plain_celery_and_says_why_once(
    store, submit, start_worker
):
    # -Q and -c are Celery's: lanepool replaces them only in a pool.
    worker = start_worker(
        outside_a_pool=True, extra=("-Q", "urgent", "-c", "2"), app_env={"CONFIGURE_AGAIN": "1"}
    )
    submit("batch", "b0", 0.0)
    submit("urgent", "u0", 0.0)
    wait_until("the job of -Q's queue done", lambda: listed(store, "finished") == ["u0"])
    log = worker.log()
    assert log.count("lanepool is off") == 1, log
    assert SAID_OFF in log
    assert "concurrency: 2 (prefork)" in log
    assert "worker of pool" not in log
    # No metrics port, though LANEPOOL_METRICS_ADDR names one: nothing to drain or stand in.
    with pytest.raises(ConnectionRefusedError):
        http(worker.metrics, "GET", "/metrics")
    assert store.llen("batch") == 1, "a queue -Q did not name was taken"
    assert worker.stop(signal.SIGTERM) == 0


def test_a_worker_with_an_empty_lanepool_lanes_is_outside_a_pool_too(store, submit, start_worker):
    worker = start_worker(outside_a_pool=True, app_env={"LANEPOOL_LANES": " "})
    submit("celery", "c0", 0.0)  # the default queue, taken when no -Q names one
    wait_until("the job done", lambda: listed(store, "finished") == ["c0"])
    assert "lanepool is off (LANEPOOL_LANES is empty;" in worker.log()


@pytest.mark.parametrize(
    ("variables", "named"),
    [
        ({"LANEPOOL_LANES": "Urgent", "LANEPOOL_ROLE": "shared"}, 'LANEPOOL_LANES="Urgent"'),
        ({"LANEPOOL_LANES": "urgent,batch"}, "LANEPOOL_ROLE is not set"),
        (
            {"LANEPOOL_LANES": "urgent", "LANEPOOL_ROLE": "shared", "LANEPOOL_SLOTS": "0"},
            'LANEPOOL_SLOTS="0"',
        ),
    ],
)
def test_a_lanepool_lanes_with_a_value_is_the_operators_and_a_bad_environment_stops_the_worker(
    app_dir, redis_server, variables, named
):
    env = {name: text for name, text in os.environ.items() if not name.startswith("LANEPOOL_")}
    env.update(PYTHONPATH=os.pathsep.join([str(SRC), str(app_dir)]), BROKER_URL=redis_server.url)
    done = subprocess.run(
        [str(BIN / "celery"), "-A", "lanes_app", "worker", "--without-mingle"],
        cwd=app_dir,
        env={**env, "LANEPOOL_POOL": "jobs", **variables},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode != 0
    assert named in done.stderr + done.stdout
    assert "lanepool is off" not in done.stderr + done.stdout


def test_a_producer_gets_no_state_and_the_settings_alone():
    # LANEPOOL_POOL is a producer's too (its counter's pool): it switches nothing on.
    for environ in ({}, {"LANEPOOL_LANES": "", "LANEPOOL_POOL": "jobs"}):
        app = celery.Celery("producer", broker="redis://127.0.0.1:1/0")
        assert configure(app, environ) is None
        assert app.conf.task_acks_late is True
        assert app.conf.worker_prefetch_multiplier == 1
        assert app.conf.broker_transport_options == {"queue_order_strategy": "priority"}
        assert app.conf.worker_concurrency is None, "Celery's own concurrency, or -c"


# -- routing a task to a lane ------------------------------------------------------------------


def test_a_task_routed_to_a_lane_lands_in_the_redis_list_of_its_name_counted_under_it(
    store, redis_server
):
    # As docs/workers.md tells: `apply_async(queue=)`, `task_routes`, `task_default_queue`.
    app = celery.Celery("routes", broker=redis_server.url)
    app.conf.task_routes = {"routes.resize": {"queue": "urgent"}}
    app.conf.task_default_queue = "batch"
    registry = CollectorRegistry()
    producer = Producer("ns", "jobs", registry=registry)
    producer.install_celery()

    @app.task(name="routes.resize")
    def resize() -> None: ...

    @app.task(name="routes.report")
    def report() -> None: ...

    try:
        resize.delay()
        report.apply_async(queue="urgent")
        report.delay()
    finally:
        before_task_publish.disconnect(producer.before_task_publish)
    assert (store.llen("urgent"), store.llen("batch"), store.llen("celery")) == (2, 1, 0)

    def submitted(lane: str) -> float | None:
        labels = {"namespace": "ns", "pool": "jobs", "lane": lane}
        return registry.get_sample_value("lanepool_jobs_submitted_total", labels)

    assert (submitted("urgent"), submitted("batch")) == (2, 1)


def test_a_task_sent_to_a_lanes_queue_of_another_name_is_counted_under_the_lane(
    store, redis_server
):
    # The producer knows the pool's spec.lanes[].queue as the workers do: LANEPOOL_QUEUES.
    app = celery.Celery("routes", broker=redis_server.url)
    registry = CollectorRegistry()
    environ = {"LANEPOOL_QUEUES": "urgent=high_priority"}
    producer = Producer("ns", "jobs", registry=registry, environ=environ)
    producer.install_celery()

    @app.task(name="routes.resize")
    def resize() -> None: ...

    try:
        resize.apply_async(queue="high_priority")
    finally:
        before_task_publish.disconnect(producer.before_task_publish)
    assert (store.llen("high_priority"), store.llen("urgent")) == (1, 0)
    labels = {"namespace": "ns", "pool": "jobs", "lane": "urgent"}
    assert registry.get_sample_value("lanepool_jobs_submitted_total", labels) == 1
    labels["lane"] = "high_priority"
    assert registry.get_sample_value("lanepool_jobs_submitted_total", labels) is None


# -- the credential ----------------------------------------------------------------------------


def test_a_post_without_the_credential_is_refused_and_the_worker_keeps_taking_jobs(
    store, submit, start_worker, credential
):
    worker = start_worker()
    assert_refused_and_unchanged(worker.metrics, credential)
    submit("batch", "b0", 0.0)
    wait_until("the job done", lambda: listed(store, "finished") == ["b0"])
    # With it, as before.
    assert value(worker.post("/stand-in?lanes=batch&seconds=60"), "lanepool_worker_standing_in")
    assert value(worker.post("/drain?seconds=60"), "lanepool_worker_draining") == 1
    submit("batch", "b1", 0.0)
    time.sleep(1.5)  # longer than kombu's 1 s BRPOP
    assert listed(store, "started") == ["b0"], "a drained worker took a job"


def test_a_worker_without_lanepool_credential_file_refuses_every_post_and_says_so(
    store, submit, start_worker, credential
):
    worker = start_worker(credential=None)
    said = said_unmounted(f"jobs-{worker.metrics[1]}")
    wait_until("the refusal said at start", lambda: said in worker.log())
    assert worker.log().count(said) == 1
    assert_refused_unmounted(worker.metrics, credential)
    submit("urgent", "u0", 0.0)
    wait_until("the job done", lambda: listed(store, "finished") == ["u0"])


def test_a_rotated_token_counts_at_once_and_the_old_one_is_refused(start_worker, own_credential):
    worker = start_worker(credential=own_credential)
    assert value(worker.post("/drain?seconds=0"), "lanepool_worker_draining") == 0
    old = own_credential.rotate()
    assert_unauthorized(worker.post_as(f"Bearer {old}", "/drain?seconds=60"), "the old token")
    assert value(worker.get(), "lanepool_worker_draining") == 0
    assert value(worker.post("/drain?seconds=60"), "lanepool_worker_draining") == 1


def test_a_stand_in_for_a_lane_not_its_own_is_forbidden_and_changes_nothing(
    store, submit, start_worker, credential
):
    worker = start_worker(lanes="urgent", role="reserved")
    answer = worker.post_as(credential.authorization, "/stand-in?lanes=reports&seconds=60")
    assert answer.status == 403
    assert answer.body == (
        'POST /stand-in: lane "reports" is not one of this worker\'s lanes (urgent)\n'
    )
    submit("reports", "r0", 0.0)
    submit("urgent", "u0", 0.0)
    wait_until("its own lane's job done", lambda: listed(store, "finished") == ["u0"])
    time.sleep(1.5)  # longer than kombu's 1 s BRPOP: a reports job would have been taken by now
    assert listed(store, "started") == ["u0"]
    assert store.llen("reports") == 1
    assert value(worker.get(), "lanepool_worker_standing_in") == 0
    assert "Started consuming from reports" not in worker.log()
