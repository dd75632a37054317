"""A missing or malformed variable is refused naming it, with the Rust worker's texts; good
values read as the operator means them."""

from __future__ import annotations

import os
import subprocess

import pytest

from lanepool_worker import ConfigError, config_from_env
from lanepool_worker.config import why_off
from processes import BIN

GOOD = {"LANEPOOL_LANES": "urgent,batch", "LANEPOOL_ROLE": "shared", "LANEPOOL_POOL": "jobs"}


def with_(**changes: str | None) -> dict[str, str]:
    env = {**GOOD, **changes}
    return {k: v for k, v in env.items() if v is not None}


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("LANEPOOL_LANES", None),
        ("LANEPOOL_LANES", " "),
        ("LANEPOOL_LANES", "urgent,,batch"),
        ("LANEPOOL_LANES", "Urgent"),
        ("LANEPOOL_LANES", "a" * 41),
        ("LANEPOOL_ROLE", None),
        ("LANEPOOL_ROLE", "dedicated"),
        ("LANEPOOL_POOL", None),
        ("LANEPOOL_SLOTS", "0"),
        ("LANEPOOL_SLOTS", "1025"),
        ("LANEPOOL_SLOTS", "two"),
        ("LANEPOOL_SLOTS", "-1"),
        ("LANEPOOL_METRICS_ADDR", "9100"),
        ("LANEPOOL_METRICS_ADDR", "::1:9100"),
        ("LANEPOOL_METRICS_ADDR", "0.0.0.0:99999"),
        ("LANEPOOL_METRICS_ADDR", "0.0.0.0:"),
        ("LANEPOOL_METRICS_ADDR", "on"),
    ],
)
def test_a_missing_or_malformed_variable_is_refused_by_name(variable: str, value: str | None):
    with pytest.raises(ConfigError) as refused:
        config_from_env(with_(**{variable: value}))
    assert variable in str(refused.value)


def test_the_texts_are_the_rust_workers():
    with pytest.raises(ConfigError, match=r"^LANEPOOL_POOL is not set: expected the LanePool's"):
        config_from_env(with_(LANEPOOL_POOL=None))
    with pytest.raises(ConfigError) as refused:
        config_from_env(with_(LANEPOOL_LANES="urgent,Batch"))
    assert str(refused.value) == (
        'LANEPOOL_LANES="urgent,Batch": "Batch" is not a lane name (lowercase letters, digits '
        "and '-'), expected comma-separated lanes such as urgent,batch"
    )
    with pytest.raises(ConfigError) as refused:
        config_from_env(with_(LANEPOOL_ROLE="reserved"))
    assert str(refused.value) == (
        'LANEPOOL_ROLE=reserved takes exactly one lane, but LANEPOOL_LANES="urgent,batch" has 2'
    )
    with pytest.raises(ConfigError, match=r'^LANEPOOL_ROLE="Shared": expected reserved or shared$'):
        config_from_env(with_(LANEPOOL_ROLE="Shared"))


def test_good_values_read_as_the_operator_means_them():
    config = config_from_env(with_(LANEPOOL_LANES=" urgent , batch ", HOSTNAME="jobs-shared-x"))
    assert config.lanes == ("urgent", "batch")
    assert (config.role, config.pool, config.name) == ("shared", "jobs", "jobs-shared-x")
    assert config.slots == 1
    assert config.metrics_addr == ("0.0.0.0", 9100)

    config = config_from_env(
        with_(LANEPOOL_SLOTS="1024", LANEPOOL_METRICS_ADDR="[::1]:9101", LANEPOOL_ROLE="shared")
    )
    assert (config.slots, config.metrics_addr) == (1024, ("::1", 9101))
    assert config.name == f"jobs-shared-{os.getpid()}"  # no HOSTNAME
    assert config_from_env(with_(LANEPOOL_METRICS_ADDR="off")).metrics_addr is None
    reserved = config_from_env(with_(LANEPOOL_LANES="urgent", LANEPOOL_ROLE="reserved"))
    assert reserved.lanes == ("urgent",)


def test_the_workers_refuse_a_bad_environment_with_exit_code_2():
    env = {"PATH": os.environ["PATH"], **with_(LANEPOOL_ROLE="dedicated")}
    for script in ("lanepool-rq-worker", "lanepool-redis-worker"):
        done = subprocess.run([str(BIN / script)], env=env, capture_output=True, text=True)
        assert done.returncode == 2, done.stderr
        assert 'LANEPOOL_ROLE="dedicated"' in done.stderr
    # One job at a time is all an RQ worker runs: more slots is refused, not ignored.
    env = {"PATH": os.environ["PATH"], **with_(LANEPOOL_SLOTS="4")}
    script = str(BIN / "lanepool-rq-worker")
    done = subprocess.run([script], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "LANEPOOL_SLOTS=4" in done.stderr


def test_only_lanepool_lanes_unset_or_empty_is_outside_a_pool():
    assert why_off({}) == "LANEPOOL_LANES is not set"
    assert why_off({"LANEPOOL_LANES": " "}) == "LANEPOOL_LANES is empty"
    # The others switch nothing on or off: LANEPOOL_POOL alone is a producer's.
    assert why_off({"LANEPOOL_POOL": "jobs", "LANEPOOL_ROLE": "shared"}) == (
        "LANEPOOL_LANES is not set"
    )
    # A value is the operator's, malformed or not: config_from_env refuses it by name.
    assert why_off({"LANEPOOL_LANES": "Urgent"}) is None
    assert why_off(GOOD) is None


def test_lanepool_rq_worker_outside_a_pool_exits_2_naming_lanepool_lanes_and_plain_rq():
    # lanepool's own command: no plain mode to fall back to, but it says what to run instead.
    script = str(BIN / "lanepool-rq-worker")
    laptop = {"PATH": os.environ["PATH"]}
    done = subprocess.run([script], env=laptop, capture_output=True, text=True)
    assert done.returncode == 2
    assert "error: LANEPOOL_LANES is not set" in done.stderr
    assert "outside a LanePool, plain RQ takes the same jobs: rq worker QUEUE..." in done.stderr
    # A pool's worker with a bad variable gets the error alone.
    env = {"PATH": os.environ["PATH"], **with_(LANEPOOL_ROLE="dedicated")}
    done = subprocess.run([script], env=env, capture_output=True, text=True)
    assert done.returncode == 2
    assert "outside a LanePool" not in done.stderr


def test_the_credential_file_is_where_the_operator_mounts_it_and_never_a_reason_to_stop():
    mounted = "/var/run/secrets/lanepool.dev/worker/token"
    assert config_from_env(with_(LANEPOOL_CREDENTIAL_FILE=mounted)).credential_file == mounted
    # Unset or empty: the worker starts, runs its jobs and refuses every drain and stand-in.
    assert config_from_env(GOOD).credential_file is None
    assert config_from_env(with_(LANEPOOL_CREDENTIAL_FILE=" ")).credential_file is None


# -- LANEPOOL_QUEUES: a lane whose queue is not named as it -------------------------------------


def test_each_lane_takes_the_queue_of_its_name_unless_lanepool_queues_names_another():
    config = config_from_env(GOOD)
    assert (config.queues, config.queue("urgent"), config.lane_of("batch")) == (
        (),
        "urgent",
        "batch",
    )
    assert config_from_env(with_(LANEPOOL_QUEUES="")).queues == ()

    # As the operator writes it: the own lanes whose queue is another, in priority order.
    longest = "é" * 127 + "q"  # 128 characters, 255 bytes: the CRD's bound is in bytes
    config = config_from_env(with_(LANEPOOL_QUEUES=f"batch={longest},urgent=high_priority"))
    assert config.queues == (("urgent", "high_priority"), ("batch", longest))
    assert (config.queue("urgent"), config.queue("batch")) == ("high_priority", longest)
    assert (config.lane_of("high_priority"), config.lane_of(longest)) == ("urgent", "batch")
    assert config.lanes_shown() == f"urgent (queue high_priority),batch (queue {longest})"
    # Any character a queue's name may have in RQ, Celery or a Redis key but the separators.
    config = config_from_env(with_(LANEPOOL_QUEUES="urgent=rq:high.priority/€"))
    assert config.queue("urgent") == "rq:high.priority/€"
    # Lanes swapping queues is two lanes, two queues.
    swapped = config_from_env(with_(LANEPOOL_QUEUES="urgent=batch,batch=urgent"))
    assert (swapped.queue("urgent"), swapped.lane_of("urgent")) == ("batch", "batch")


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("urgent", "is not lane=queue"),
        ("urgent=", "is not lane=queue"),
        ("=high_priority", "is not lane=queue"),
        ("urgent=high,priority", "is not lane=queue"),
        ("urgent=high=priority", "is not lane=queue"),
        ("urgent=high priority", "is not lane=queue"),
        ("urgent=high\tpriority", "is not lane=queue"),
        ("urgent=high\x7fpriority", "is not lane=queue"),
        ("Urgent=high_priority", "is not lane=queue"),
        ("urgent=" + "é" * 128, "is not lane=queue"),  # 128 characters, 256 bytes
        ("urgent=a,urgent=b", 'lane "urgent" twice'),
        ("bulk=low", '"bulk" is not one of LANEPOOL_LANES="urgent,batch"'),
        ("urgent=jobs,batch=jobs", 'lanes urgent and batch take the same queue "jobs"'),
        ("urgent=batch", 'lanes urgent and batch take the same queue "batch"'),
    ],
)
def test_a_malformed_lanepool_queues_is_refused_by_name(value: str, says: str):
    with pytest.raises(ConfigError) as refused:
        config_from_env(with_(LANEPOOL_QUEUES=value))
    assert str(refused.value).startswith("LANEPOOL_QUEUES="), refused.value
    assert says in str(refused.value)
