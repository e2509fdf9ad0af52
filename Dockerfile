# dtrain image: `docker build -t dtrain .`, then e.g. `docker run --gpus all dtrain dtrain --help`.
# The Kubernetes manifests in scripts/k8s/ run this image's /usr/local/bin/dtrain.
#
# Base: Debian 12 plus NVIDIA's CUDA apt repository for debian12, not nvidia/cuda:*-ubuntu24.04.
# scripts/setup.sh names Debian 12 packages (libgloo-dev's 2022 snapshot, libyaml-cpp 0.7,
# abseil 20220623, python3-torch 1.13) and the project is built and tested on exactly that;
# Ubuntu 24.04 carries other versions (yaml-cpp 0.8, a newer torch), and NVIDIA publishes no
# Debian CUDA images. Both stages therefore start from Debian and take CUDA 13.0 and NCCL from
# the same NVIDIA repository, so builder and runtime match library for library.

ARG DEBIAN=bookworm
ARG CUDA_REPO=https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64

# --- builder: the same two scripts as the README (setup.sh, build.sh), plus the CUDA toolkit.
FROM debian:${DEBIAN} AS builder
ARG CUDA_REPO
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ADD ${CUDA_REPO}/cuda-keyring_1.1-1_all.deb /tmp/
# Only the CUDA parts the build uses (nvcc, cudart, cuBLAS, NCCL), not the 5 GB toolkit.
RUN dpkg -i /tmp/cuda-keyring_1.1-1_all.deb && apt-get update && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      cuda-nvcc-13-0 cuda-cudart-dev-13-0 libcublas-dev-13-0 \
      'libnccl2=*+cuda13.0' 'libnccl-dev=*+cuda13.0' && \
    rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY scripts/setup.sh scripts/
RUN scripts/setup.sh && rm -rf /var/lib/apt/lists/*
COPY . .
# No GPU at build time: name the architectures (A100, H100) instead of CMake's "native".
ENV PATH=/usr/local/cuda-13.0/bin:${PATH} CUDAARCHS="80;90"
RUN scripts/build.sh -DDTRAIN_BUILD_TESTS=OFF && \
    install -D -m 755 build/dtrain /out/usr/local/bin/dtrain && \
    install -m 755 build/libdtrain_cuda.so /out/usr/local/bin/libdtrain_cuda.so && \
    mkdir -p /out/usr/local/share/dtrain && cp -r configs scripts/slurm /out/usr/local/share/dtrain/
# The Debian packages that own every shared library dtrain links: the runtime stage installs
# exactly these, so the list follows the build. CUDA's (cudart, cuBLASLt, NCCL) are the CUDA
# module's, beside the binary (loaded at run time), and come from NVIDIA's repository below.
RUN ldd build/dtrain | awk '$3 ~ /^\// {print $3}' | while read -r lib; do \
      real=$(readlink -f "$lib"); \
      dpkg -S "$real" 2>/dev/null || dpkg -S "${real#/usr}" 2>/dev/null || \
        { echo "no Debian package owns $lib" >&2; exit 1; }; \
    done | cut -d: -f1 | sort -u > /out/runtime-packages.txt && cat /out/runtime-packages.txt

# --- runtime: Debian slim, dtrain's shared libraries and CUDA's runtime libraries only.
FROM debian:${DEBIAN}-slim
ARG CUDA_REPO
SHELL ["/bin/bash", "-euo", "pipefail", "-c"]
ADD ${CUDA_REPO}/cuda-keyring_1.1-1_all.deb /tmp/
COPY --from=builder /out/runtime-packages.txt /tmp/
# cudart, cuBLAS(Lt) and NCCL for the CUDA module, libdtrain_cuda.so beside the binary, which the
# binary loads when run.device is cuda; ca-certificates for https shards.
RUN dpkg -i /tmp/cuda-keyring_1.1-1_all.deb && apt-get update && \
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      $(cat /tmp/runtime-packages.txt) ca-certificates \
      cuda-cudart-13-0 libcublas-13-0 'libnccl2=*+cuda13.0' && \
    rm -rf /var/lib/apt/lists/* /tmp/*
COPY --from=builder /out/usr/local /usr/local
# What the NVIDIA container runtime reads to mount the driver into the container.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility \
    LD_LIBRARY_PATH=/usr/local/cuda-13.0/targets/x86_64-linux/lib
WORKDIR /work
CMD ["dtrain", "--help"]
