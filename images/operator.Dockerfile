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
# The dependencies first, in a layer of their own: read from pyproject.toml, so only a
# change there installs them again, and a source change reuses the layer. The build backend
# comes with them, so the package itself installs below without reaching the index.
COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
        print(*p["build-system"]["requires"], *p["project"]["dependencies"], \
              *p["project"]["optional-dependencies"]["operator"], sep="\n")' > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
# pyproject.toml names README.md as the package readme, so the build needs it.
COPY README.md ./
COPY operator/ operator/
# A regular (not editable) install: the final stage copies only the virtualenv.
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation ".[operator]"

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
