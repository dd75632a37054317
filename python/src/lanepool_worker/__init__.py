"""lanepool's worker protocol for Python workers: lanes in order, the metric convention, the
metrics port with drain and stand-in requests, and adapters for RQ, Celery and asyncio.

Importing it starts nothing: `serve()` starts the metrics port, the adapters start workers.
"""

from .config import Config, ConfigError, config_from_env
from .server import ServingThread, serve
from .state import Job, WorkerState

__all__ = [
    "Config",
    "ConfigError",
    "Job",
    "ServingThread",
    "WorkerState",
    "config_from_env",
    "serve",
]
