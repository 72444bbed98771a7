# The trainwave runtime image: the init container of every worker with
# spec.runtime. It only carries the pure-Python runtime and copies it into the
# worker's shared volume (`python -m trainwave.runtime.install /opt/trainwave`);
# torch comes from the user's own worker image, so this image installs none.
#
#   docker build -f images/runtime.Dockerfile -t trainwave/runtime:0.1.0 .

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="trainwave-runtime" \
      org.opencontainers.image.description="trainwave's acceleration runtime, injected into workers" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /src
# The dependencies first, in a layer of their own (see operator.Dockerfile). No extras: the
# installer needs the standard library only.
COPY pyproject.toml ./
RUN python -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb")); \
        print(*p["project"]["dependencies"], sep="\n")' > /tmp/requirements.txt \
    && pip install --no-cache-dir -r /tmp/requirements.txt && rm /tmp/requirements.txt
COPY README.md ./
COPY operator/ operator/
# Build isolation keeps the build backend out of the image.
RUN pip install --no-cache-dir --no-deps . && rm -rf /src
USER 65532:65532
ENTRYPOINT ["python", "-m", "trainwave.runtime.install"]
CMD ["/opt/trainwave"]
