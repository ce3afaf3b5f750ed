# Ferry's image. Here (podman, no Docker Hub): `make image` (scripts/image.sh). Elsewhere:
#   docker build -t ferry .                     # CPU torch and torchvision (the small image)
#   docker build --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cu128 -t ferry:cuda .
#   docker build --build-arg TORCH_INDEX_URL= -t ferry:pypi .   # PyPI's default builds
# with an index that has torch ${TORCH_VERSION} and torchvision ${TORCHVISION_VERSION}
# (scripts/check_torch_build.py stops the build when pip installs another build or an
# unmatched pair, naming them). CUDA wheels carry their runtime libraries; the host needs the
# NVIDIA container toolkit and a driver for that CUDA version. The install steps are
# scripts/install.sh, the script `make venv` (and so CI) runs. docs/kserve.md: sizes, start-up.
ARG PYTHON_IMAGE=python:3.11-slim
FROM ${PYTHON_IMAGE}

ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
ARG TORCH_VERSION=2.13.0
ARG TORCHVISION_VERSION=0.28.0

WORKDIR /opt/ferry/src
# torch and torchvision first, in a layer of their own: a change to Ferry rebuilds from the
# COPY of its sources on, not the gigabyte below.
COPY scripts/install.sh scripts/check_torch_build.py ./scripts/
RUN TORCH_INDEX_URL="${TORCH_INDEX_URL}" TORCH_VERSION="${TORCH_VERSION}" \
        TORCHVISION_VERSION="${TORCHVISION_VERSION}" \
        scripts/install.sh /opt/ferry/venv torch \
    && rm -rf /root/.cache
COPY pyproject.toml README.md ./
COPY ferry ./ferry
RUN scripts/install.sh /opt/ferry/venv runtime && rm -rf /root/.cache
COPY deploy/kserve/torchserve /usr/local/bin/torchserve
COPY deploy/sagemaker/serve /usr/local/bin/serve

# TMPDIR: where Ferry unpacks archives and keeps compile caches (a tmpfs or emptyDir under
# a read-only root); logs go to the container's output, not to files.
ENV PATH=/opt/ferry/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp
RUN useradd --uid 1000 --create-home model-server
USER 1000
WORKDIR /home/model-server
# Inference, management, metrics; gRPC inference and management.
EXPOSE 8080 8081 8082 7070 7071
# KServe passes `torchserve --start ...`, SageMaker `serve` (ferry sagemaker-serve, port
# 8080, /opt/ml/model); anything else runs as given.
CMD ["ferry", "serve", "--foreground", "--model-store", "/mnt/models/model-store"]
