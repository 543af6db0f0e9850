#!/usr/bin/env bash
# Installs Lockstep's build and test dependencies (Debian packages) that are missing.
# Checks each package with dpkg-query first and runs apt-get only when something is missing, so
# a second run is fast and needs no network. Works as root; otherwise uses sudo.
set -euo pipefail

packages=(
  # toolchain
  cmake ninja-build g++ clang-format pkg-config
  # libraries (ARCHITECTURE.md, "Dependencies")
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev libyaml-cpp-dev libcpprest-dev
  prometheus-cpp-dev libgloo-dev nlohmann-json3-dev libopenblas-dev libssl-dev zlib1g-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev
  # data sets of the examples and tests; reference implementations for comparisons
  dataset-fashion-mnist python3-sklearn python3-torch
  # MPI, for comparisons against a conventional launcher
  openmpi-bin libopenmpi-dev
  # the operator's tests: etcd, a kube-apiserver built from Debian's source by
  # scripts/kube-apiserver.sh (Go 1.19, reflect2 1.0.2, dpkg-source, rsync), curl and openssl
  etcd-server golang-1.19-go golang-github-modern-go-reflect2-dev dpkg-dev make rsync curl openssl
)

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages are installed"
  exit 0
fi

if [[ $(id -u) -eq 0 ]]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1; then
  as_root=(sudo)
else
  echo "setup: missing packages: ${missing[*]}" >&2
  echo "setup: not root and sudo is not available; install them as root" >&2
  exit 1
fi

echo "setup: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
  "${missing[@]}"
