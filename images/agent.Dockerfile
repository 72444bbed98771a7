# The trainwave node agent image.
#
#   docker build -f images/agent.Dockerfile -t trainwave/agent:0.1.0 .
#
# The build context is the repository root (see /.dockerignore); the chart's
# DaemonSet runs this image as `trainwave agent --root /host ...` with the
# host's /sys and /proc mounted read-only under /host.

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
              *p["project"]["optional-dependencies"]["agent"], sep="\n")' > /tmp/requirements.txt \
    && /opt/venv/bin/pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt
# pyproject.toml names README.md as the package readme, so the build needs it.
COPY README.md ./
COPY operator/ operator/
# The `agent` extra: NVML bindings and the Kubernetes client, no kopf. NVML's
# shared library is not in the image: the NVIDIA container runtime mounts the
# node driver's own copy (runtimeClassName / NVIDIA_VISIBLE_DEVICES in the chart).
RUN /opt/venv/bin/pip install --no-deps --no-build-isolation ".[agent]"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainwave-agent" \
      org.opencontainers.image.description="trainwave node agent: GPUs, NVLink, RDMA NICs and shared GPU memory as node labels and resources" \
      org.opencontainers.image.licenses="Apache-2.0"
# No .pyc writes (the chart mounts the root filesystem read-only) and unbuffered
# logs, so a crash never loses its last lines.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /opt/venv /opt/venv
# Numeric user and group, so the kubelet can verify runAsNonRoot without an
# /etc/passwd entry. Reading sysfs, procfs and NVML needs no root.
USER 65532:65532
# The chart passes the flags; run bare, the image starts the agent with its
# defaults (node name from $NODE_NAME, host root /).
ENTRYPOINT ["trainwave"]
CMD ["agent"]
