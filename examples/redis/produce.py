"""The demo's producer: Poisson arrivals on several lanes of RQ queues (or Celery's, with
`--queue celery`), each job submitted through lanepool_worker.producer (counted in
`lanepool_jobs_submitted_total{namespace, pool, lane}`, served at --metrics-port, and stamped with
its submission time), and its id added to the demo's ledger (jobs.py, celery_app.py). It prints
a line a second.

    python produce.py --url redis://127.0.0.1:6379/0 --namespace demo --pool jobs --duration 120 \\
        --lane urgent --rate 0s=30,40s=150,80s=30 --job-ms 20 \\
        --lane batch --rate 4 --job-ms 2000..4000 --backlog 200

With `--plain` it is a producer no one changed for lanepool: RQ's own `Queue.enqueue` and
Celery's own `apply_async(queue=...)`, nothing counted or stamped and no metrics served (the
operator then measures the lanes from the workers and the queues' depth).

It only submits: it never takes, runs or removes a job.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

from jobs import SUBMITTED
from lanepool_worker.producer import Producer
from prometheus_client import start_http_server
from redis import Redis
from rq import Queue


@dataclass
class Lane:
    name: str
    rate: list[tuple[float, float]]  # (from second, jobs per second), in time order
    job_ms: tuple[float, float]  # uniform between the two
    backlog: int

    def rate_at(self, elapsed: float) -> float:
        return next((rate for start, rate in reversed(self.rate) if elapsed >= start), 0.0)


def rate_profile(text: str) -> list[tuple[float, float]]:
    """`30` or `0s=30,40s=150`: jobs per second from each time on."""
    if "=" not in text:
        return [(0.0, float(text))]
    steps = (step.split("=") for step in text.split(","))
    return sorted((float(at.removesuffix("s")), float(rate)) for at, rate in steps)


def milliseconds(text: str) -> tuple[float, float]:
    """`20` or `2000..4000`."""
    low, _, high = text.partition("..")
    return float(low), float(high or low)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[Lane]]:
    """Options, then one `--lane NAME [--rate R] [--job-ms MS] [--backlog N]` group per lane."""
    parser = argparse.ArgumentParser(usage=__doc__.split("\n\n")[1])
    parser.add_argument("--url", default="redis://127.0.0.1:6379/0")
    parser.add_argument("--namespace", default="demo")
    parser.add_argument("--pool", default="jobs")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of arrivals")
    parser.add_argument("--metrics-port", type=int, default=9465)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--queue", choices=["rq", "celery"], default="rq", help="whose jobs")
    parser.add_argument(
        "--plain", action="store_true", help="enqueue as a producer unchanged for lanepool does"
    )
    lane_parser = argparse.ArgumentParser(prog="--lane")
    lane_parser.add_argument("name")
    lane_parser.add_argument("--rate", type=rate_profile, default=[(0.0, 1.0)])
    lane_parser.add_argument("--job-ms", type=milliseconds, default=(20.0, 20.0))
    lane_parser.add_argument("--backlog", type=int, default=0)
    starts = [i for i, word in enumerate(argv) if word == "--lane"] + [len(argv)]
    args = parser.parse_args(argv[: starts[0]])
    if len(starts) == 1:
        parser.error("at least one --lane NAME")
    lanes = [
        Lane(**vars(lane_parser.parse_args(argv[a + 1 : b]))) for a, b in itertools.pairwise(starts)
    ]
    return args, lanes


def main(argv: list[str]) -> None:
    args, lanes = parse(argv)
    redis = Redis.from_url(args.url)
    producer = None if args.plain else Producer(args.namespace, args.pool)
    if producer is not None:
        start_http_server(args.metrics_port)
    rng = random.Random(args.seed)
    counts = {lane.name: 0 for lane in lanes}
    send = celery_sender(args.url, producer, redis) if args.queue == "celery" else None
    queues = {lane.name: Queue(lane.name, connection=redis) for lane in lanes}

    def submit(lane: Lane) -> None:
        seconds = rng.uniform(*lane.job_ms) / 1000
        if send is not None:
            send(lane.name, seconds)
        else:
            queue = queues[lane.name]
            if producer is None:
                job = queue.enqueue("jobs.sleep_job", seconds)
            else:
                job = producer.submit_rq(queue, "jobs.sleep_job", seconds)
            redis.sadd(SUBMITTED, job.id)
        counts[lane.name] += 1

    for lane in lanes:
        for _ in range(lane.backlog):
            submit(lane)
    began = time.monotonic()
    due = {lane.name: began for lane in lanes}  # each lane's next arrival
    next_line = began + 1
    while (now := time.monotonic()) < began + args.duration:
        for lane in lanes:
            while due[lane.name] <= now:
                rate = lane.rate_at(due[lane.name] - began)
                if rate > 0:
                    submit(lane)
                # Poisson: exponential gaps at the rate of the moment (a lane at 0 looks again
                # a tenth of a second later).
                due[lane.name] += rng.expovariate(rate) if rate > 0 else 0.1
        if now >= next_line:
            print(time.strftime("%H:%M:%S"), "submitted:", counts, flush=True)
            next_line += 1
        time.sleep(max(0.0, min([*due.values(), next_line]) - time.monotonic()))


def celery_sender(
    url: str, producer: Producer | None, redis: Redis
) -> Callable[[str, float], None]:
    """Sends the demo's Celery task (celery_app.py, which reads its broker from the environment
    when imported), stamped and counted by the producer's publish hook unless `producer` is
    `None` (`--plain`)."""
    os.environ["LANEPOOL_REDIS_URL"] = url
    import celery_app

    if producer is not None:
        producer.install_celery()

    def send(lane: str, seconds: float) -> None:
        celery_app.submit(redis, lane, seconds)

    return send


if __name__ == "__main__":
    main(sys.argv[1:])
