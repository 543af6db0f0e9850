#!/bin/sh
# The e2e fixture's setup: records the host's iptables rules (the cleanup checks that none were
# added), then `scripts/cluster.sh up`. Skips (77) where the cluster cannot run: not root.
# Usage: cluster_up.sh CLUSTER_SH IPTABLES_BEFORE_FILE
set -e
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the e2e cluster needs root (network namespaces, mounts, cgroups)"
  exit 77
fi
"$1" down
iptables -S >"$2"
exec "$1" up
