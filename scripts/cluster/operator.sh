# Installs the operator the way `helm install` would: the chart's CRDs first, then its objects
# rendered by helm_render (Go's text/template and sprig, as Helm; tests/packaging/helm_render)
# with scripts/cluster/values.yaml, applied with kubectl. Sourced.

readonly operator_namespace=lockstep-system
readonly release=lockstep

helm_render_binary() {
  local binary="$build_dir/tests/packaging/helm_render/helm_render"
  [[ -x "$binary" ]] || die "no $binary: build the project first (scripts/build.sh)"
  echo "$binary"
}

install_operator() {
  local renderer
  renderer=$(helm_render_binary)
  kubectl_admin apply -f "$repo/charts/lockstep/crds/" >/dev/null
  kubectl_admin create namespace "$operator_namespace" --dry-run=client -o yaml |
    kubectl_admin apply -f - >/dev/null
  "$renderer" --chart "$repo/charts/lockstep" --values "$repo/scripts/cluster/values.yaml" \
    --release "$release" --namespace "$operator_namespace" --kube-version v1.20.2 \
    >"$state/operator.yaml"
  kubectl_admin apply -n "$operator_namespace" -f "$state/operator.yaml" >/dev/null
  kubectl_admin -n "$operator_namespace" rollout status deployment/"$release-operator" --timeout=120s \
    >/dev/null || die "the operator did not become ready: kubectl -n $operator_namespace get pods"
}
