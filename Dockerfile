# pgworker container image.
#
#   docker build -t pgworker:0.1.0 .
#   docker run --rm -e PGWORKER_DSN=... -e PGWORKER_APP=myapp.tasks:app pgworker:0.1.0
#   docker run --rm -p 8080:8080 -e PGWORKER_DSN=... -e PGWORKER_WEB_USERS=... pgworker:0.1.0 \
#       web --host 0.0.0.0                     # the web console (docs/web.md)
#
# Your tasks must be importable inside the image: build your own image FROM this one
# and `pip install` your package into /opt/venv (see docs/deploy.md).
# Checked with `hadolint --failure-threshold warning Dockerfile` (tests/deploy).

# The base of both stages: Python 3.11 on Debian bookworm with venv. The default is the
# official image; any Debian bookworm with python3, python3-venv and ca-certificates
# works too (`--build-arg BASE_IMAGE=...`: CI builds with buildah on one assembled with
# debootstrap from Debian's packages, see tests/deploy/test_deploy_image.py).
ARG BASE_IMAGE=python:3.11.14-slim-bookworm

# ---- builder: a virtualenv with pgworker, its OTLP exporter and its web console ------
FROM ${BASE_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PATH=/opt/venv/bin:$PATH

RUN python3 -m venv /opt/venv

WORKDIR /src
COPY pyproject.toml README.md ./
COPY pgworker ./pgworker
# The project itself, from this source tree (setuptools via pyproject.toml); its
# dependencies as wheels only, so no compiler is ever needed (nor installed).
RUN pip install --no-cache-dir --only-binary=:all: "./[otlp,web]"

# ---- runtime -------------------------------------------------------------------------
FROM ${BASE_IMAGE}

LABEL org.opencontainers.image.title="pgworker" \
      org.opencontainers.image.description="PostgreSQL-backed job queue and multiprocess worker" \
      org.opencontainers.image.licenses="Apache-2.0"

# tini is PID 1: it forwards SIGTERM to the supervisor (which then stops claiming and
# gives running jobs their shutdown grace) and reaps orphaned children.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 pgworker \
    && useradd --system --uid 10001 --gid 10001 --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin pgworker \
    && mkdir -p /tmp/pgworker-metrics \
    && chown 10001:10001 /tmp/pgworker-metrics

COPY --from=builder /opt/venv /opt/venv

# PROMETHEUS_MULTIPROC_DIR must be writable: under Kubernetes with a read-only root
# filesystem the chart mounts an emptyDir here. `pgworker run` wipes it at start.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PROMETHEUS_MULTIPROC_DIR=/tmp/pgworker-metrics

USER 10001:10001

# /metrics, /healthz, /readyz (--metrics-port, PGWORKER_METRICS_PORT); the console of
# `pgworker web` (--port)
EXPOSE 9186 8080

ENTRYPOINT ["tini", "--", "pgworker"]
CMD ["run"]
