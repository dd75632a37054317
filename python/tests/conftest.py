"""Fixtures: one real redis-server for the session (127.0.0.1, a free port, no persistence, in a
temporary directory), emptied before each test that asks for it; and the pool's worker credential
that every worker is started with, as the operator mounts it (or a test's own, which it rotates).

Nothing here stands in for Redis or RQ: the tests run the real server and real worker processes.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis import Redis

from processes import RedisServer, WorkerCredential, start_redis, write_credential

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(REDIS_SERVER, tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis(redis_server: RedisServer) -> Iterator[Redis]:
    client = Redis(port=redis_server.port)
    client.flushall()
    yield client
    client.close()


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A redis-server of the test's own that writes every change to its append-only file, so it
    can be killed and started again with its data."""
    server = start_redis(REDIS_SERVER, tmp_path, durable=True)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def credential(tmp_path_factory: pytest.TempPathFactory) -> WorkerCredential:
    """The token every worker of the tests is started with. Never rotated: a test that rotates
    one has its own (`own_credential`)."""
    return write_credential(tmp_path_factory.mktemp("credential"))


@pytest.fixture
def own_credential(tmp_path: Path) -> WorkerCredential:
    """A token of the test's own, for a worker started with it and then rotated."""
    return write_credential(tmp_path)
