"""The Python worker's own cost, measured on a real redis-server with real worker processes (not
run by the tests; a few minutes on 2 cores):

1. GET /metrics and POST /drain?seconds=0 answer times, p50 and p99, while a lanepool-rq-worker
   runs jobs back to back: 1 ms CPU-bound jobs, then 50 ms sleeping ones; and during one long
   CPU-bound job, with the switch interval lanepool sets (1 ms) and Python's default (5 ms).
2. Jobs a second one RQ worker sustains with 1 ms jobs, lanepool-rq-worker against plain
   `rq worker`, SimpleWorker and forking.
3. Urgent wait (start - enqueue) of one shared worker behind a 50 ms batch backlog, urgent jobs
   of 5 ms and of 50 ms arriving 10 a second: simple against fork, for the default worker class.

    target/python/bin/python python/bench.py

Its functions `cpu` and `nap` are also the jobs the workers run (imported as `bench`).
"""

from __future__ import annotations

import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent


def cpu(ms: float) -> None:
    end = time.perf_counter() + ms / 1000
    while time.perf_counter() < end:
        pass


def nap(ms: float) -> None:
    time.sleep(ms / 1000)


def percentiles(values: list[float]) -> str:
    ordered = sorted(values)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"p50 {p50 * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms, max {ordered[-1] * 1000:.1f} ms"


@contextmanager
def redis_server() -> Iterator[object]:
    sys.path.insert(0, str(HERE / "tests"))
    from processes import start_redis  # the tests' own helper: a real server, a free port

    with tempfile.TemporaryDirectory() as directory:
        server = start_redis("/usr/bin/redis-server", Path(directory))
        try:
            yield server
        finally:
            server.stop()


def start(
    command: list[str], lanes: str, metrics_port: int, extra_env: dict[str, str] | None = None
):
    env = {
        **os.environ,
        "LANEPOOL_LANES": lanes,
        "LANEPOOL_ROLE": "shared" if "," in lanes else "reserved",
        "LANEPOOL_POOL": "bench",
        "LANEPOOL_METRICS_ADDR": f"127.0.0.1:{metrics_port}",
        "HOSTNAME": "bench-1",
        **(extra_env or {}),
    }
    return subprocess.Popen(command, env=env, cwd=HERE, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)  # fmt: skip


def timed(request: Callable[[], object], count: int, pause: float) -> list[float]:
    times = []
    for _ in range(count):
        began = time.perf_counter()
        request()
        times.append(time.perf_counter() - began)
        time.sleep(pause)
    return times


def answer_times(server, redis, authorization: str) -> None:  # type: ignore[no-untyped-def]
    from rq import Queue

    from processes import free_port, http

    print("\n1. answer times of the metrics port while the worker runs jobs")
    for label, func, ms, count in (("1 ms CPU jobs", "bench.cpu", 1, 20000),
                                   ("50 ms sleep jobs", "bench.nap", 50, 400)):  # fmt: skip
        redis.flushall()
        queue = Queue("urgent", connection=redis)
        for _ in range(count):
            queue.enqueue(func, ms)
        port = free_port()
        worker = start([str(BIN / "lanepool-rq-worker"), "--url", server.url, "--logging-level",
                        "WARNING"], "urgent", port)  # fmt: skip
        try:
            time.sleep(1.5)  # started, jobs running
            addr = ("127.0.0.1", port)
            gets = timed(lambda a=addr: http(a, "GET", "/metrics"), 300, 0.01)
            drains = timed(lambda a=addr: http(a, "POST", "/drain?seconds=0",
                                               authorization=authorization), 300, 0.01)  # fmt: skip
            left = queue.count
            assert left > 0, "the jobs ran out during the measure"
            print(f"   {label:>16}: GET /metrics {percentiles(gets)}")
            print(f"   {label:>16}: POST /drain  {percentiles(drains)}")
        finally:
            worker.terminate()
            worker.wait()

    for label, interval in (("1 ms (lanepool)", "0.001"), ("5 ms (Python default)", "0.005")):
        redis.flushall()
        Queue("urgent", connection=redis).enqueue("bench.cpu", 20000)
        port = free_port()
        code = (
            "import sys; import lanepool_worker.server as s; "
            f"s.SWITCH_INTERVAL = {interval}; sys.setswitchinterval({interval}); "
            "from lanepool_worker.rq import main; sys.exit(main())"
        )
        worker = start([sys.executable, "-c", code, "--url", server.url, "--logging-level",
                        "WARNING"], "urgent", port)  # fmt: skip
        try:
            time.sleep(1.5)
            addr = ("127.0.0.1", port)
            gets = timed(lambda a=addr: http(a, "GET", "/metrics"), 200, 0.01)
            print(f"   one CPU-bound job, switch interval {label}: GET {percentiles(gets)}")
        finally:
            worker.kill()
            worker.wait()


def rq_timestamps(redis, queue_name: str) -> list[tuple[float, float, float]]:  # type: ignore[no-untyped-def]
    """(enqueued, started, ended) of every finished job of the queue, Unix seconds."""
    from rq.job import Job
    from rq.registry import FinishedJobRegistry

    ids = FinishedJobRegistry(queue_name, connection=redis).get_job_ids()
    jobs = Job.fetch_many(ids, connection=redis)
    return [(j.enqueued_at.timestamp(), j.started_at.timestamp(), j.ended_at.timestamp())
            for j in jobs if j is not None]  # fmt: skip


def throughput(server, redis) -> None:  # type: ignore[no-untyped-def]
    from rq import Queue

    from processes import free_port

    print("\n2. jobs a second one worker sustains with 1 ms CPU jobs (2000 jobs)")
    plain = [str(BIN / "rq"), "worker", "--url", server.url, "--logging_level", "WARNING"]
    ours = [str(BIN / "lanepool-rq-worker"), "--url", server.url, "--logging-level", "WARNING"]
    cases = [
        ("plain rq worker, SimpleWorker", [*plain, "-w", "rq.worker.SimpleWorker", "urgent"]),
        ("lanepool-rq-worker, simple", [*ours, "--worker-class", "simple"]),
        ("plain rq worker, fork", [*plain, "urgent"]),
        ("lanepool-rq-worker, fork", [*ours, "--worker-class", "fork"]),
    ]
    for label, command in cases:
        redis.flushall()
        queue = Queue("urgent", connection=redis)
        for _ in range(2000):
            queue.enqueue("bench.cpu", 1)
        worker = start(command, "urgent", free_port())
        try:
            while queue.count:
                time.sleep(0.1)
            time.sleep(1.0)  # the last job's bookkeeping
        finally:
            worker.terminate()
            worker.wait()
        stamps = rq_timestamps(redis, "urgent")
        span = max(end for _, _, end in stamps) - min(start for _, start, _ in stamps)
        print(
            f"   {label:>30}: {len(stamps) / span:.0f} jobs/s ({len(stamps)} jobs in {span:.2f} s)"
        )


def urgent_wait(server, redis) -> None:  # type: ignore[no-untyped-def]
    from rq import Queue

    from processes import free_port

    print("\n3. urgent wait behind a 50 ms batch backlog, urgent arriving 10/s (40 jobs)")
    for urgent_ms in (5, 50):
        for worker_class in ("simple", "fork"):
            redis.flushall()
            batch = Queue("batch", connection=redis)
            for _ in range(400):
                batch.enqueue("bench.nap", 50)
            worker = start([str(BIN / "lanepool-rq-worker"), "--url", server.url,
                            "--worker-class", worker_class, "--logging-level", "WARNING"],
                           "urgent,batch", free_port())  # fmt: skip
            try:
                time.sleep(1.5)
                urgent = Queue("urgent", connection=redis)
                for _ in range(40):
                    urgent.enqueue("bench.nap", urgent_ms)
                    time.sleep(0.1)
                time.sleep(1.0)
            finally:
                worker.terminate()
                worker.wait()
            waits = [started - enqueued for enqueued, started, _ in rq_timestamps(redis, "urgent")]
            print(f"   urgent {urgent_ms:>2} ms jobs, {worker_class:>6}: wait {percentiles(waits)}"
                  f" ({len(waits)} jobs)")  # fmt: skip


def main() -> None:
    from redis import Redis

    with redis_server() as server, tempfile.TemporaryDirectory() as mounted:
        redis = Redis(port=server.port)  # type: ignore[attr-defined]
        print(
            f"Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, redis-server on a free port"
        )
        # The drains carry the pool's credential, as the operator's do: the worker reads its file
        # at every POST, and that read is part of what an answer costs.
        token = secrets.token_hex(32)
        (Path(mounted) / "token").write_text(f"{token}\n")
        os.environ["LANEPOOL_CREDENTIAL_FILE"] = str(Path(mounted) / "token")
        answer_times(server, redis, f"Bearer {token}")
        throughput(server, redis)
        urgent_wait(server, redis)


if __name__ == "__main__":
    main()
