# replag's image. Two ways to build it:
#
#   docker build -t replag .                           # official Python base, PyPI
#   deploy/image/build replag-base:bookworm replag:dev  # wheels built on the host,
#                                                       # installed with --no-index
#
# The final stage holds the base's Python and a virtual environment in /opt/replag,
# nothing else: no compiler, no pip. It runs as the unprivileged user 10001.
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 PIP_ROOT_USER_ACTION=ignore
COPY deploy/image/wheels/ /wheels/
COPY pyproject.toml README.md hatch_build.py /src/
COPY replag/ /src/replag/
# With wheels from deploy/image/build: those only, no index. Without: from the source,
# with a C compiler for the optional scan extension (this stage only). Then pip goes,
# and numpy's own test suite (a running service never reads it).
RUN python3 -m venv /opt/replag \
 && if ls /wheels/replag-*.whl >/dev/null 2>&1; then \
      /opt/replag/bin/pip install --no-index --find-links /wheels 'replag[postgres]'; \
    else \
      apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
      && /opt/replag/bin/pip install '/src[postgres]'; \
    fi \
 && /opt/replag/bin/python -m pip uninstall -y -q pip setuptools \
 && find /opt/replag/lib -depth -type d \( -name tests -o -name testing \) -path '*/numpy/*' \
      -exec rm -rf {} + \
 && /opt/replag/bin/replag --version

FROM ${BASE_IMAGE}
COPY --from=build /opt/replag /opt/replag
# A fixed uid/gid, so Kubernetes' runAsNonRoot can see it is not root.
RUN groupadd --system --gid 10001 replag \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/replag --create-home \
      --shell /usr/sbin/nologin replag
ENV PATH=/opt/replag/bin:$PATH \
    HOME=/var/lib/replag \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    REPLAG_LOG_FORMAT=json \
    REPLAG_HEALTH_URL=http://127.0.0.1:8700/-/ready
USER 10001:10001
WORKDIR /var/lib/replag
# 8700: serve (dashboard, API, /metrics); 8701: an agent.
EXPOSE 8700 8701
# The API's readiness endpoint (open without a token). An agent's container sets
# REPLAG_HEALTH_URL=http://127.0.0.1:8701/agent/v1/health.
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 \
  CMD ["python3", "-c", "import os, urllib.request; urllib.request.urlopen(os.environ['REPLAG_HEALTH_URL'], timeout=4)"]
ENTRYPOINT ["replag"]
CMD ["serve", "--host", "0.0.0.0", "--config", "/etc/replag/replag.toml"]
