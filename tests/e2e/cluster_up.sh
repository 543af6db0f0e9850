#!/bin/sh
# The e2e fixture's setup: records the host's iptables rules (the cleanup checks that none were
# added), then `scripts/cluster.sh up`, then the images of users' own the tests run, built with
# `cluster.sh build-image` and loaded into both nodes with `cluster.sh load-image` (as a user
# does with kind): examples/pytorch (Debian trixie's PyTorch 2.6, no Lockstep) and an image with
# neither a shell nor a C library (tests/e2e/images/no-shell). Skips (77) where the cluster cannot
# run: not root.
# Usage: cluster_up.sh CLUSTER_SH IPTABLES_BEFORE_FILE
set -e
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the e2e cluster needs root (network namespaces, mounts, cgroups)"
  exit 77
fi
cluster=$1
repo=$(cd "$(dirname "$cluster")/.." && pwd)
"$cluster" down
iptables -S >"$2"
"$cluster" up

pytorch=$("$cluster" build-image "$repo/examples/pytorch" localhost/lockstep/pytorch-example:dev)
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp "$repo/tests/e2e/images/no-shell/Dockerfile" "$context/"
cp /bin/busybox "$context/busybox"
no_shell=$("$cluster" build-image "$context" localhost/lockstep/no-shell:dev)
"$cluster" load-image "$pytorch" "$no_shell"
# Which archive was loaded, for the test that reads the image's layers.
echo "$pytorch" >"${LOCKSTEP_CLUSTER_DIR:-/var/lib/lockstep-cluster}/user-image.archive"
