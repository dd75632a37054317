"""lanepool's own log lines (a worker's start, its drains and stand-ins, Redis lost) on stdout.

Only the console scripts call it: a library must never configure a host application's logging.
"""

from __future__ import annotations

import logging
import sys


def setup_logging() -> None:
    """One line each, at INFO whatever the framework's own level: they are what an operator of
    the pool reads."""
    logger = logging.getLogger("lanepool_worker")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S"))
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(logging.INFO)
