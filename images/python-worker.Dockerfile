# The Python workers' image: the lanepool-worker package (python/) with its rq, celery and redis
# extras in a venv, and the demo's jobs (examples/redis) in the working directory, so
# `lanepool-rq-worker --path examples/redis` and `celery --workdir examples/redis -A celery_app
# worker` run as examples/redis/lanepool-rq.yaml and lanepool-celery.yaml say.
#
# Built from a checkout, the repository's root as the context (.dockerignore sends only what the
# COPY lines name), by docker, podman or buildah alike:
#     docker build -f images/python-worker.Dockerfile -t registry.example.com/lanepool/python-worker:0.1.0 .
#     podman build -f images/python-worker.Dockerfile -t ... .
#     buildah bud -f images/python-worker.Dockerfile -t ... .
# images/build.sh builds it the same way, on a base it makes with debootstrap where no registry
# serves one (images/python-base.sh: Debian bookworm, its python3 3.11 and python3-venv).
#
# BASE is any image with python3 (3.10 or later) and its venv module, Debian's useradd and grep
# (the python:*-slim images, a Debian or Ubuntu with python3-venv); pip reaches PyPI while it
# builds. Your own jobs: build FROM this image and COPY them into /app (docs/workers.md).
ARG BASE=docker.io/library/python:3.11-slim-bookworm
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

# The versions the Python tests run against, less the test tools (pytest, ruff); first, so their
# layer stays cached while only the package changes.
COPY python/requirements-test.txt /tmp/requirements-test.txt
RUN grep -vE '^[[:space:]]*(#|$)|^(pytest|ruff)([^A-Za-z0-9_.-]|$)' /tmp/requirements-test.txt \
      >/opt/requirements.txt \
 && rm /tmp/requirements-test.txt \
 && python3 -m venv /opt/lanepool \
 && mv /opt/requirements.txt /opt/lanepool/requirements.txt \
 && pip install --quiet --requirement /opt/lanepool/requirements.txt

# The package alone (its dependencies are the pinned ones above, which `pip check` confirms);
# setuptools goes (pip builds in an isolated environment of its own), pip stays for images built
# FROM this one.
COPY python/pyproject.toml python/README.md /tmp/lanepool-worker/
COPY python/src /tmp/lanepool-worker/src
RUN pip install --quiet --no-deps /tmp/lanepool-worker \
 && pip uninstall --quiet --yes setuptools \
 && pip check \
 && rm -rf /tmp/lanepool-worker

WORKDIR /app
COPY examples/redis/*.py /app/examples/redis/
RUN python3 -m compileall -q /app/examples \
 && groupadd --gid 65532 nonroot \
 && useradd --key UID_MAX=65532 --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin nonroot

# The chart's runAsUser and runAsGroup; files stay root's, so the process can change none.
USER 65532:65532
# LANEPOOL_METRICS_ADDR's default port: /metrics, POST /drain and POST /stand-in.
EXPOSE 9100
CMD ["lanepool-rq-worker", "--path", "examples/redis"]
