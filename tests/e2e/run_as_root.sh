#!/bin/sh
# Runs the e2e test COMMAND, or skips it (exit 77) where the cluster cannot run: not root.
if [ "$(id -u)" -ne 0 ]; then
  echo "skipped: the e2e cluster needs root (network namespaces, mounts, cgroups)"
  exit 77
fi
exec "$@"
