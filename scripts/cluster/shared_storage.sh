# Storage both nodes share, ReadWriteMany, for checkpoints that outlive a pod moving between nodes
# (docs/cluster.md, "Shared storage"): a GlusterFS volume served from the host, mounted by each
# node's kubelet through Kubernetes' in-tree glusterfs volume plugin and the GlusterFS FUSE client.
#
# Why GlusterFS and not NFS: this machine's kernel has neither an NFS server nor an NFS client
# (no CONFIG_NFS_FS, CONFIG_NFSD, and no modules), and every Kubernetes NFS volume is a kernel
# mount. FUSE is built in, and Kubernetes 1.20 mounts GlusterFS through it (the glusterfs plugin
# runs mount -t glusterfs, Debian's glusterfs-client). A job sees a PersistentVolumeClaim either
# way; on a cluster of yours, any ReadWriteMany storage class (NFS, CephFS, a cloud file store).
#
# The server: glusterd on the bridge's address with its state under $state/gluster, one brick
# ($state/gluster/brick), volume lockstep-shared; a Service and Endpoints "lockstep-glusterfs" in
# the default namespace name it for the plugin. `shared-volume NS NAME` makes a
# PersistentVolume for the whole volume bound to claim NAME in namespace NS. Sourced.

readonly gluster_volume=lockstep-shared
readonly gluster_service=lockstep-glusterfs

gluster_dir() { echo "$state/gluster"; }
gluster_cli() {
  gluster --mode=script --glusterd-sock="$(gluster_dir)/cli.socket" \
    --log-file="$state/logs/gluster-cli.log" "$@"
}

start_shared_storage() {
  local dir
  dir=$(gluster_dir)
  mkdir -p "$dir/state" "$dir/brick" "$dir/run"
  # Writable by any pod's user, sticky as /tmp: a job's checkpoint folder is its own.
  chmod 1777 "$dir/brick"
  cat >"$dir/glusterd.vol" <<VOL
volume management
    type mgmt/glusterd
    option working-directory $dir/state
    option glusterd-sockfile $dir/cli.socket
    option transport-type socket
    option transport.socket.bind-address $control_plane_ip
    option transport.socket.listen-port 24007
    option ping-timeout 0
    option event-threads 1
    option base-port 49152
    option max-port 49251
end-volume
VOL
  start_daemon glusterd -- glusterd --no-daemon -f "$dir/glusterd.vol" \
    -S "$dir/glusterd.socket" -p "$dir/run/glusterd.pid" -l "$state/logs/glusterd.log" \
    --xlator-option "*.run-directory=$dir/run"
  wait_for 30 "glusterd" gluster_cli volume list
  gluster_cli volume create "$gluster_volume" "$control_plane_ip:$dir/brick" force >/dev/null ||
    die "gluster volume create failed (log: $state/logs/glusterd.log)"
  # Only the nodes mount it (the brick listens on every address of the host).
  gluster_cli volume set "$gluster_volume" auth.allow "${bridge_cidr%.*}.*" >/dev/null ||
    die "gluster volume set auth.allow failed (log: $state/logs/glusterd.log)"
  gluster_cli volume start "$gluster_volume" >/dev/null ||
    die "gluster volume start failed (log: $state/logs/glusterd.log)"
}

# The Service and Endpoints the glusterfs plugin reads the server's address from.
publish_shared_storage() {
  kubectl_admin apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Service
metadata: {name: $gluster_service, namespace: default}
spec:
  ports: [{port: 24007}]
---
apiVersion: v1
kind: Endpoints
metadata: {name: $gluster_service, namespace: default}
subsets:
- addresses: [{ip: $control_plane_ip}]
  ports: [{port: 24007}]
YAML
}

# shared_volume NAMESPACE NAME: a PersistentVolume "<NAMESPACE>-<NAME>" of the whole GlusterFS
# volume, bound to the PersistentVolumeClaim NAME in NAMESPACE (both made here; the namespace must
# exist). Retained when the claim goes: the data is the checkpoints.
shared_volume() {
  local namespace=$1 name=$2
  kubectl_admin apply -f - >/dev/null <<YAML
apiVersion: v1
kind: PersistentVolume
metadata: {name: $namespace-$name, labels: {lockstep.io/shared-storage: glusterfs}}
spec:
  capacity: {storage: 10Gi}
  accessModes: [ReadWriteMany]
  persistentVolumeReclaimPolicy: Retain
  storageClassName: lockstep-shared
  claimRef: {namespace: $namespace, name: $name}
  glusterfs: {endpoints: $gluster_service, endpointsNamespace: default, path: $gluster_volume}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: $name, namespace: $namespace}
spec:
  accessModes: [ReadWriteMany]
  storageClassName: lockstep-shared
  volumeName: $namespace-$name
  resources: {requests: {storage: 10Gi}}
YAML
  # Bound before it returns: a pod of an unbound claim waits for the kubelet's next try.
  wait_for 60 "claim $namespace/$name bound" claim_bound "$namespace" "$name"
  echo "persistentvolumeclaim/$name in $namespace: ReadWriteMany, GlusterFS volume $gluster_volume"
}

claim_bound() {
  [[ $(kubectl_admin get pvc "$2" -n "$1" -o jsonpath='{.status.phase}') == Bound ]]
}

# Stops the brick and glusterd (their pids are in the run directory and $state/pids).
stop_shared_storage() {
  local dir pids
  dir=$(gluster_dir)
  [[ -d "$dir" ]] || return 0
  if daemon_running glusterd; then
    gluster_cli volume stop "$gluster_volume" >/dev/null 2>&1 || true
  fi
  stop_daemon glusterd 5
  pids=$(pgrep -f -- "$dir/" || true)
  # shellcheck disable=SC2086
  if [[ -n "$pids" ]]; then stop_pids 5 $pids; fi
  # The brick's log, where glusterd puts every brick's: named after the brick's path.
  local brick_log=${dir#/}/brick
  rm -f "/var/log/glusterfs/bricks/${brick_log//\//-}.log"
  return 0
}
