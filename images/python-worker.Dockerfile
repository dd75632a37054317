# The Python workers' image: the lanepool-worker package (python/) with its rq, celery and redis
# extras in a venv on Python 3.11, and the demo's jobs (examples/redis) in the working directory,
# so `lanepool-rq-worker --path examples/redis` and `celery --workdir examples/redis -A celery_app
# worker` run as examples/redis/lanepool-rq.yaml and lanepool-celery.yaml say. For your own jobs,
# build FROM it and copy them into /app, or install the package into your own image the same way.
#
# The build context is a directory prepared by images/build.sh (target/images/context/python-worker/):
#     requirements.txt   python/requirements-test.txt without the test tools (pytest, ruff)
#     python/            pyproject.toml, README.md and src/ of the package
#     examples/redis/    the demo's jobs, producer and Celery app
# and builds with a registry's Python image:
#     docker build -f images/python-worker.Dockerfile -t ghcr.io/lanepool/python-worker:0.1.0 \
#       target/images/context/python-worker
# Without a registry, images/build.sh makes the base with debootstrap (images/python-base.sh:
# Debian bookworm, its python3 3.11 and python3-venv) and passes it as BASE.
ARG BASE=python:3.11-slim-bookworm
FROM ${BASE}

ARG VERSION=unknown
LABEL org.opencontainers.image.title="python-worker" \
      org.opencontainers.image.description="lanepool's Python workers (RQ, Celery, asyncio on Redis lists) with the demo's jobs" \
      org.opencontainers.image.source="https://github.com/lanepool/lanepool" \
      org.opencontainers.image.version="${VERSION}"

# Logs reach the runtime as they are written; the root is read-only at run time, so nothing is
# compiled then (everything is compiled here) and pip keeps no cache in the image.
ENV PATH=/opt/lanepool/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

# The pinned dependencies first: their layer stays cached while only the package changes.
COPY requirements.txt /opt/lanepool/requirements.txt
RUN python3 -m venv /opt/lanepool \
 && pip install --quiet --requirement /opt/lanepool/requirements.txt

# The package alone (its dependencies are the pinned ones above, which `pip check` confirms);
# setuptools goes (pip builds in an isolated environment of its own), pip stays for images built
# FROM this one.
COPY python /tmp/lanepool-worker
RUN pip install --quiet --no-deps /tmp/lanepool-worker \
 && pip uninstall --quiet --yes setuptools \
 && pip check \
 && rm -rf /tmp/lanepool-worker

WORKDIR /app
COPY examples/redis /app/examples/redis
RUN python3 -m compileall -q /app/examples \
 && groupadd --gid 65532 nonroot \
 && useradd --key UID_MAX=65532 --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nonroot

# The chart's runAsUser and runAsGroup; files stay root's, so the process can change none.
USER 65532:65532
# LANEPOOL_METRICS_ADDR's default port: /metrics, POST /drain and POST /stand-in.
EXPOSE 9100
CMD ["lanepool-rq-worker", "--path", "examples/redis"]
