# Ferry's image: `docker build -t ferry .` (CPU torch), or for CUDA
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t ferry:cuda .
# with an index that has torch ${TORCH_VERSION} (scripts/check_torch_build.py stops the build
# when pip installs another build, naming both). CUDA wheels carry their runtime libraries;
# the host needs the NVIDIA container toolkit and a driver for that CUDA version.
# Its install step is scripts/install.sh, the script `make venv` (and so CI) runs.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0

WORKDIR /opt/ferry/src
COPY pyproject.toml README.md ./
COPY ferry ./ferry
COPY scripts/install.sh scripts/check_torch_build.py ./scripts/
RUN TORCH_INDEX_URL="${TORCH_INDEX_URL}" TORCH_VERSION="${TORCH_VERSION}" \
        scripts/install.sh /opt/ferry/venv runtime \
    && rm -rf /root/.cache
COPY deploy/kserve/torchserve /usr/local/bin/torchserve

ENV PATH=/opt/ferry/venv/bin:$PATH \
    PYTHONUNBUFFERED=1
RUN useradd --uid 1000 --create-home model-server
USER 1000
WORKDIR /home/model-server
# Inference, management, metrics; gRPC inference and management.
EXPOSE 8080 8081 8082 7070 7071
# KServe passes `torchserve --start ...`; anything else runs as given.
CMD ["ferry", "serve", "--foreground", "--model-store", "/mnt/models/model-store"]
