# The control plane, in the host's network namespace on the bridge's address: etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler, with the flags kubeadm gives them
# where this cluster needs them. Sourced.

start_control_plane() {
  local etcd_url="http://$control_plane_ip:$etcd_port"
  local peer_url="http://$control_plane_ip:$etcd_peer_port"
  start_daemon etcd -- etcd --name lockstep --data-dir "$state/etcd" \
    --listen-client-urls "$etcd_url" --advertise-client-urls "$etcd_url" \
    --listen-peer-urls "$peer_url" --initial-advertise-peer-urls "$peer_url" \
    --initial-cluster "lockstep=$peer_url" --log-level warn
  wait_for 30 "etcd healthy" curl -fsS --max-time 2 "$etcd_url/health"

  # --kubelet-preferred-address-types: node names do not resolve here, so the API server reaches
  # kubelets (logs, exec) by the address each node reports. --enable-aggregator-routing: the
  # API server calls webhooks at their endpoints' pod addresses; it runs outside any node and so
  # has no kube-proxy to turn a Service's cluster address into one.
  start_daemon kube-apiserver -- "$k8s_bin/kube-apiserver" \
    --etcd-servers="$etcd_url" \
    --bind-address="$control_plane_ip" --advertise-address="$control_plane_ip" \
    --secure-port="$apiserver_port" --insecure-port=0 \
    --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
    --client-ca-file="$pki/ca.crt" \
    --authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
    --service-cluster-ip-range="$service_cidr" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
    --kubelet-client-certificate="$pki/apiserver-kubelet-client.crt" \
    --kubelet-client-key="$pki/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority="$pki/ca.crt" \
    --kubelet-preferred-address-types=InternalIP \
    --enable-aggregator-routing=true \
    --v=1
  wait_for 60 "kube-apiserver ready" kubectl_admin get --raw /readyz

  # Node lifecycle as a kubeadm cluster has it (a node is NotReady 40 s after its last
  # heartbeat; its pods are evicted by the not-ready/unreachable taints' tolerations).
  start_daemon kube-controller-manager -- "$k8s_bin/kube-controller-manager" \
    --kubeconfig="$state/controller-manager.kubeconfig" \
    --authentication-kubeconfig="$state/controller-manager.kubeconfig" \
    --authorization-kubeconfig="$state/controller-manager.kubeconfig" \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --use-service-account-credentials=true --cluster-cidr="$cluster_cidr" \
    --allocate-node-cidrs=false --leader-elect=false \
    --bind-address="$control_plane_ip" --port=0 --secure-port=10257 \
    --v=1
  start_daemon kube-scheduler -- "$k8s_bin/kube-scheduler" \
    --kubeconfig="$state/scheduler.kubeconfig" \
    --authentication-kubeconfig="$state/scheduler.kubeconfig" \
    --authorization-kubeconfig="$state/scheduler.kubeconfig" \
    --leader-elect=false --bind-address="$control_plane_ip" --port=0 --secure-port=10259 \
    --v=1
}

stop_control_plane() {
  local name
  for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do
    stop_daemon "$name"
  done
}
