# The trainwave operator image.
#
#   docker build -f images/operator.Dockerfile -t trainwave/operator:0.1.0 .
#
# The build context is the repository root (see /.dockerignore); the chart runs
# this image as `trainwave operator --metrics-port ... --health-port ...`.

# One base for both stages: the virtualenv built in the first stage links to this
# interpreter, so the second stage must have the very same one. The tag pins the
# Python minor version and the Debian release; patch releases arrive on rebuild.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
WORKDIR /src
# pyproject.toml names README.md as the package readme, so the build needs it.
COPY pyproject.toml README.md ./
COPY operator/ operator/
# A regular (not editable) install: the final stage copies only the virtualenv.
RUN /opt/venv/bin/pip install ".[operator]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainwave-operator" \
      org.opencontainers.image.description="Kubernetes operator for AI training clusters" \
      org.opencontainers.image.licenses="Apache-2.0"
# No .pyc writes (the chart mounts the root filesystem read-only) and unbuffered
# logs, so a crash never loses its last lines.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# Numeric user and group, so the kubelet can verify runAsNonRoot without an
# /etc/passwd entry. 65532 is the conventional "nonroot" id.
USER 65532:65532
# The chart passes the subcommand and its flags as args; run bare, the image
# starts the operator with its defaults.
ENTRYPOINT ["trainwave"]
CMD ["operator"]
