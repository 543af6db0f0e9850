# syntax=docker/dockerfile:1
# Lockstep images, from one multi-stage build:
#
#   docker build --target operator   -t REGISTRY/lockstep-operator:TAG .    # debian:bookworm-slim + operator
#   docker build --target worker     -t REGISTRY/lockstep-worker:TAG .      # CUDA runtime + NCCL + worker
#   docker build --target worker-cpu -t REGISTRY/lockstep-worker-cpu:TAG .  # CPU only, Debian alone
#   docker build --target agent      -t REGISTRY/lockstep-agent:TAG .       # the exec agent alone
#
# The operator, worker-cpu and agent images need nothing but Debian's packages (scripts/cluster.sh builds
# them with buildah on a base made by mmdebstrap); only the worker image needs NVIDIA's repository.
#
# Base images. Lockstep links Debian bookworm's libraries (gRPC 1.51, protobuf 32, Gloo, cpprest,
# prometheus-cpp, OpenBLAS; docs/architecture.md, "Dependencies"), so both the build and the runtime
# stages must be bookworm. The nvidia/cuda images exist only for Ubuntu and RHEL-family
# distributions, whose library versions differ; using one would mean building every dependency
# from source. So the CUDA toolkit comes from NVIDIA's own apt repository for Debian 12 (the same
# packages the nvidia/cuda images are made of): cuda-nvcc, cuBLAS and NCCL -dev packages in the
# build stage, only their runtime packages in the worker stage.
#
# Runtime stages install exactly the Debian packages whose shared libraries `ldd` lists for the
# binaries they copy (tests/packaging/dockerfile_test.py checks this against the build's binaries),
# run as a non-root user, and contain no compiler, headers or -dev package.

ARG DEBIAN_RELEASE=bookworm
# CUDA major.minor; NVIDIA's package names carry it as 13-0.
ARG CUDA_VERSION=13.0
ARG CUDA_PACKAGE_VERSION=13-0
# GPU architectures of the CUDA kernels (see kernels/CMakeLists.txt).
ARG CUDA_ARCHITECTURES="90-real;80-virtual"

# ---------------------------------------------------------------------------------------------
# cuda-apt: NVIDIA's apt repository definition and signing key (cuda-keyring), so that the
# stages below can apt-get CUDA packages without carrying curl.
FROM debian:${DEBIAN_RELEASE}-slim AS cuda-apt
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && curl -fsSLo /tmp/cuda-keyring.deb \
      https://developer.download.nvidia.com/compute/cuda/repos/debian12/x86_64/cuda-keyring_1.1-1_all.deb \
 && dpkg -i /tmp/cuda-keyring.deb \
 && rm -rf /var/lib/apt/lists/* /tmp/cuda-keyring.deb

# ---------------------------------------------------------------------------------------------
# toolchain: the compiler and Debian's -dev packages (scripts/setup.sh lists the same ones).
FROM debian:${DEBIAN_RELEASE} AS toolchain
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
      cmake ninja-build g++ pkg-config \
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev libyaml-cpp-dev libcpprest-dev \
      prometheus-cpp-dev libgloo-dev nlohmann-json3-dev libopenblas-dev libssl-dev libxxhash-dev zlib1g-dev \
      libcli11-dev \
      patchelf ccache \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src

# ---------------------------------------------------------------------------------------------
# build-cpu: lockstep, lockstep-worker, lockstep-operator and lockstep-agent without CUDA, into
# /src/build/bin; the agent's self-contained bundle (scripts/bundle/agent.sh) into /src/agent.
FROM toolchain AS build-cpu
COPY . .
# ccache in a cache mount (BuildKit's and buildah's RUN --mount=type=cache): kept between builds
# and out of the image, so a rebuild after a change compiles only what the change touched.
RUN --mount=type=cache,id=lockstep-ccache-cpu,target=/root/.cache/ccache \
    cmake -S . -B build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_BENCH=OFF -DLOCKSTEP_WITH_CUDA=OFF \
 && cmake --build build --target lockstep lockstep-worker lockstep-operator lockstep-agent \
      lockstep-agent-launcher \
 && strip build/bin/lockstep build/bin/lockstep-worker build/bin/lockstep-operator \
 && scripts/bundle/agent.sh --out /src/agent build/bin/lockstep-agent-launcher \
      build/bin/lockstep-agent python/lockstep

# ---------------------------------------------------------------------------------------------
# build: the same with the CUDA toolkit (NVIDIA's packages); builds lockstep and lockstep-worker
# with the CUDA kernels and NCCL into /src/build/bin.
FROM toolchain AS build
ARG CUDA_VERSION
ARG CUDA_PACKAGE_VERSION
ARG CUDA_ARCHITECTURES
COPY --from=cuda-apt /usr/share/keyrings/cuda-archive-keyring.gpg /usr/share/keyrings/
COPY --from=cuda-apt /etc/apt/sources.list.d/cuda-debian12-x86_64.list /etc/apt/sources.list.d/
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      cuda-nvcc-${CUDA_PACKAGE_VERSION} cuda-cudart-dev-${CUDA_PACKAGE_VERSION} \
      libcublas-dev-${CUDA_PACKAGE_VERSION} libnccl-dev \
 && rm -rf /var/lib/apt/lists/*
ENV PATH=/usr/local/cuda/bin:${PATH}
COPY . .
RUN --mount=type=cache,id=lockstep-ccache-cuda,target=/root/.cache/ccache \
    cmake -S . -B build -G Ninja \
      -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
      -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
      -DLOCKSTEP_BUILD_TESTS=OFF -DLOCKSTEP_BUILD_BENCH=OFF \
      -DLOCKSTEP_WITH_CUDA=ON -DLOCKSTEP_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" \
 && cmake --build build --target lockstep lockstep-worker \
 && strip build/bin/lockstep build/bin/lockstep-worker

# ---------------------------------------------------------------------------------------------
# operator: lockstep-operator alone (it needs no CUDA, so it comes from build-cpu). It writes
# nothing to disk (the chart mounts the root filesystem read-only) and talks to the API server
# over TLS (ca-certificates is not needed: it trusts the in-cluster service account CA file).
FROM debian:${DEBIAN_RELEASE}-slim AS operator
# runtime libraries: the packages of `ldd lockstep-operator`
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libbrotli1 libc-ares2 libc6 libcpprest2.10 libgcc-s1 libgrpc++1.51 \
      libgrpc29 libprometheus-cpp-core1.0 libprotobuf32 libre2-9 libssl3 libstdc++6 \
      libyaml-cpp0.7 zlib1g \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-cpu /src/build/bin/lockstep-operator /usr/bin/lockstep-operator
# 65532: the conventional "nonroot" id; the chart's securityContext uses the same numbers.
RUN groupadd --gid 65532 lockstep && useradd --uid 65532 --gid 65532 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin lockstep
USER 65532:65532
EXPOSE 8080 7443
ENTRYPOINT ["/usr/bin/lockstep-operator"]

# ---------------------------------------------------------------------------------------------
# worker: lockstep-worker (what the operator starts in every pod) and the lockstep command
# (validate, ckpt), on the CUDA runtime, cuBLAS and NCCL. The GPU driver (libcuda) comes from the
# node through the NVIDIA container toolkit.
FROM debian:${DEBIAN_RELEASE}-slim AS worker
ARG CUDA_VERSION
ARG CUDA_PACKAGE_VERSION
COPY --from=cuda-apt /usr/share/keyrings/cuda-archive-keyring.gpg /usr/share/keyrings/
COPY --from=cuda-apt /etc/apt/sources.list.d/cuda-debian12-x86_64.list /etc/apt/sources.list.d/
# runtime libraries: the packages of `ldd lockstep-worker` and `ldd lockstep`, and cuBLAS, which
# the first CUDA device opens with dlopen (kernels/cuda/cublas_library.h)
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libbrotli1 libc-ares2 libc6 libcpprest2.10 libgcc-s1 libgfortran5 \
      libgloo0 libgrpc++1.51 libgrpc29 libhiredis0.14 libibverbs1 libnl-3-200 \
      libnl-route-3-200 libopenblas0-pthread libprometheus-cpp-core1.0 libprotobuf32 \
      libquadmath0 libre2-9 libssl3 libstdc++6 libxxhash0 libyaml-cpp0.7 zlib1g \
      cuda-cudart-${CUDA_PACKAGE_VERSION} libcublas-${CUDA_PACKAGE_VERSION} libnccl2 \
 && rm -rf /var/lib/apt/lists/*
# loaded at run time (dlopen), so not in ldd: the RDMA providers libibverbs loads for
# RoCE/InfiniBand NICs (mlx5, ...)
RUN apt-get update \
 && apt-get install -y --no-install-recommends ibverbs-providers \
 && rm -rf /var/lib/apt/lists/*
# data: the Fashion-MNIST files examples/fashion-mnist.yaml reads
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/build/bin/lockstep-worker /src/build/bin/lockstep /usr/bin/
# The pure-Python helpers (`from lockstep import progress`): the exec agent puts this folder, the
# one beside its binary's bin/, on the command's PYTHONPATH.
COPY python/lockstep /usr/lib/lockstep/python/lockstep
RUN echo /usr/local/cuda-${CUDA_VERSION}/targets/x86_64-linux/lib > /etc/ld.so.conf.d/cuda.conf \
 && ldconfig \
 && groupadd --gid 65532 lockstep && useradd --uid 65532 --gid 65532 --create-home \
      --home-dir /home/lockstep --shell /usr/sbin/nologin lockstep
# What the NVIDIA container toolkit reads: expose every GPU the pod was given, compute only.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
USER 65532:65532
WORKDIR /home/lockstep
EXPOSE 9400
ENTRYPOINT ["/usr/bin/lockstep-worker"]

# ---------------------------------------------------------------------------------------------
# worker-cpu: the worker without CUDA (allReduce over shared memory or Gloo), from Debian's
# packages alone, with python3 for exec-mode programs that need no PyTorch (`from lockstep
# import progress`); a PyTorch program needs an image of yours with torch (Debian's python3-torch
# is 1.13 and would make this image several times larger).
FROM debian:${DEBIAN_RELEASE}-slim AS worker-cpu
# runtime libraries: the packages of `ldd lockstep-worker` and `ldd lockstep`
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      libabsl20220623 libbrotli1 libc-ares2 libc6 libcpprest2.10 libgcc-s1 libgfortran5 \
      libgloo0 libgrpc++1.51 libgrpc29 libhiredis0.14 libibverbs1 libnl-3-200 \
      libnl-route-3-200 libopenblas0-pthread libprometheus-cpp-core1.0 libprotobuf32 \
      libquadmath0 libre2-9 libssl3 libstdc++6 libxxhash0 libyaml-cpp0.7 zlib1g \
 && rm -rf /var/lib/apt/lists/*
# data and exec mode: the Fashion-MNIST files examples/fashion-mnist.yaml reads; python3
RUN apt-get update \
 && apt-get install -y --no-install-recommends dataset-fashion-mnist python3 \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build-cpu /src/build/bin/lockstep-worker /src/build/bin/lockstep /usr/bin/
COPY python/lockstep /usr/lib/lockstep/python/lockstep
RUN groupadd --gid 65532 lockstep && useradd --uid 65532 --gid 65532 --create-home \
      --home-dir /home/lockstep --shell /usr/sbin/nologin lockstep
USER 65532:65532
WORKDIR /home/lockstep
EXPOSE 9400
ENTRYPOINT ["/usr/bin/lockstep-worker"]

# ---------------------------------------------------------------------------------------------
# agent: the exec agent's bundle and nothing else, at /lockstep, where its own loader is named
# (scripts/bundle/agent.sh). The operator runs it as the init container of a command job's pod
# in an image of the user's: `/lockstep/bin/lockstep-agent install /lockstep-volume` copies the
# bundle into the volume the user's container then mounts at /lockstep (docs/exec.md, "Your own
# image"). No shell, no C library of its own beyond the bundle's: it needs none.
FROM scratch AS agent
COPY --from=build-cpu /src/agent /lockstep
USER 65532:65532
ENTRYPOINT ["/lockstep/bin/lockstep-agent"]
