# Installs the operator as a user does: `helm install` of charts/lockstep (Helm v4 from
# scripts/helm-tools.sh; Helm creates the chart's CRD from crds/ first) with
# scripts/cluster/values.yaml, waiting until the operator's replicas are ready. Sourced.

readonly operator_namespace=lockstep-system
readonly release=lockstep

cluster_helm() {
  local helm
  helm=$("$repo/scripts/helm-tools.sh") || die "no helm: scripts/setup.sh installs it"
  "$helm" --kubeconfig "$state/admin.kubeconfig" "$@"
}

install_operator() {
  cluster_helm install "$release" "$repo/charts/lockstep" --namespace "$operator_namespace" \
    --create-namespace --values "$repo/scripts/cluster/values.yaml" >"$state/helm-install.log" ||
    die "helm install failed: $(tail -n 5 "$state/helm-install.log")"
  kubectl_admin -n "$operator_namespace" rollout status deployment/"$release-operator" --timeout=120s \
    >/dev/null || die "the operator did not become ready: kubectl -n $operator_namespace get pods"
}
