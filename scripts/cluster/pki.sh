# The cluster's certificates and kubeconfigs (as kubeadm makes them, with openssl): one CA signs
# the API server's serving certificate, each component's client certificate (its user and group
# are the certificate's CN and O), and each kubelet's serving certificate. Sourced.

pki=$state/pki

# issue NAME CN O KIND [SAN]: a P-256 key and a certificate for one year; KIND is client or server.
issue() {
  local name=$1 cn=$2 org=$3 kind=$4 san=${5:-}
  local subject="/CN=$cn"
  [[ -n "$org" ]] && subject="/O=$org$subject"
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/$name.key" 2>/dev/null
  local ext="$pki/$name.ext"
  {
    echo "basicConstraints=critical,CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    if [[ $kind == server ]]; then echo "extendedKeyUsage=serverAuth"; else echo "extendedKeyUsage=clientAuth"; fi
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } >"$ext"
  openssl req -new -key "$pki/$name.key" -subj "$subject" -out "$pki/$name.csr" 2>/dev/null
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 365 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
  rm -f "$pki/$name.csr" "$ext"
}

# kubeconfig FILE NAME: a kubeconfig for the client certificate NAME against the API server.
kubeconfig() {
  local file=$1 name=$2
  cat >"$file" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: lockstep
  cluster:
    server: https://$control_plane_ip:$apiserver_port
    certificate-authority: $pki/ca.crt
users:
- name: $name
  user:
    client-certificate: $pki/$name.crt
    client-key: $pki/$name.key
contexts:
- name: lockstep
  context: {cluster: lockstep, user: $name}
current-context: lockstep
KUBECONFIG
}

make_pki() {
  mkdir -p "$pki"
  chmod 700 "$pki"
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/ca.key" 2>/dev/null
  openssl req -x509 -new -key "$pki/ca.key" -subj /CN=lockstep-cluster-ca -days 365 \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
    -out "$pki/ca.crt" 2>/dev/null
  issue apiserver kube-apiserver "" server \
    "DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost,IP:$control_plane_ip,IP:$kubernetes_service_ip,IP:127.0.0.1"
  issue apiserver-kubelet-client kube-apiserver-kubelet-client system:masters client
  issue admin kubernetes-admin system:masters client
  issue controller-manager system:kube-controller-manager "" client
  issue scheduler system:kube-scheduler "" client
  issue kube-proxy system:kube-proxy "" client
  local node
  for node in "${nodes[@]}"; do
    issue "kubelet-$node" "system:node:$node" system:nodes client
    issue "kubelet-$node-serving" "$node" "" server "DNS:$node,IP:${node_ip[$node]}"
  done
  # The service account tokens' signing key.
  openssl ecparam -name prime256v1 -genkey -noout -out "$pki/sa.key" 2>/dev/null
  openssl ec -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null

  kubeconfig "$state/admin.kubeconfig" admin
  kubeconfig "$state/controller-manager.kubeconfig" controller-manager
  kubeconfig "$state/scheduler.kubeconfig" scheduler
  kubeconfig "$state/kube-proxy.kubeconfig" kube-proxy
  for node in "${nodes[@]}"; do kubeconfig "$state/kubelet-$node.kubeconfig" "kubelet-$node"; done
}
