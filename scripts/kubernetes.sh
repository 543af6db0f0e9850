#!/usr/bin/env bash
# Builds (once) and caches Kubernetes 1.20.2 from Debian bookworm's `kubernetes` source package, with
# Debian's Go 1.19: kube-apiserver and kube-controller-manager (the integration tests' control
# plane), and kube-scheduler, kubelet, kube-proxy and the pause container's program (the cluster
# scripts/cluster.sh starts). Prints the path of kube-apiserver (the others lie beside it).
#
#   scripts/kubernetes.sh            # build when missing, print .../bin/kube-apiserver
#   scripts/kubernetes.sh --bin-dir  # build when missing, print the bin directory
#   scripts/kubernetes.sh --rebuild  # build again even when cached
#
# Cache: ${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/kubernetes-1.20.2/bin/, outside the repository;
# the build log stays in .../kubernetes-1.20.2/build.log. A second caller waits on a lock (bounded by
# LOCKSTEP_KUBE_BUILD_LOCK_TIMEOUT seconds, default 1800) instead of building twice.
#
# How the build works (docs/test-apiserver.md has the why):
#   - the Debian source is fetched with `apt-get source` against a private deb-src list in the
#     build directory (the system's apt configuration is left alone; the mirror is the one in
#     /etc/apt/sources.list.d/debian.sources, else deb.debian.org);
#   - vendor/github.com/modern-go/reflect2 1.0.1 (broken on Go >= 1.18) is replaced by the 1.0.2 of
#     golang-github-modern-go-reflect2-dev, go.mod and vendor/modules.txt updated to match;
#   - `make gen_openapi` (the generated OpenAPI file is not shipped), then `make WHAT="cmd/..."` in
#     GOPATH mode (GO111MODULE=off), at nice 10 with -p 2 so that the machine stays usable;
#   - pause: build/pause/linux/pause.c, compiled static with gcc (the sandbox image's only file).
#   About 8-10 minutes on 2 cores.
set -euo pipefail

readonly version=1.20.2
readonly debian_source=kubernetes
readonly goroot=/usr/lib/go-1.19
readonly reflect2_src=/usr/share/gocode/src/github.com/modern-go/reflect2
readonly build_packages=(golang-1.19-go golang-github-modern-go-reflect2-dev dpkg-dev make rsync gcc
                         libc6-dev)
readonly programs=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)

mode=apiserver
rebuild=0
for arg in "$@"; do
  case "$arg" in
    --bin-dir) mode=bindir ;;
    --rebuild) rebuild=1 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "kubernetes.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

cache_root=${LOCKSTEP_CACHE_DIR:-${HOME:-/tmp}/.cache/lockstep}
prefix="$cache_root/kubernetes-$version"
bindir="$prefix/bin"
log="$prefix/build.log"

print_result() {
  if [[ $mode == bindir ]]; then echo "$bindir"; else echo "$bindir/kube-apiserver"; fi
}

# Bump when the build changes what the binaries do: cached binaries of another recipe are rebuilt.
# 2: the empty-string validation fix; 3: the node programs and pause; 4: the NoExecute taint fix
readonly recipe=4

is_built() {
  local program
  for program in "${programs[@]}" pause; do [[ -x "$bindir/$program" ]] || return 1; done
  [[ "$(cat "$bindir/recipe" 2>/dev/null)" == "$recipe" ]] &&
    "$bindir/kube-apiserver" --version 2>/dev/null | grep -q "v$version"
}

say() { echo "kubernetes.sh: $*" >&2; }

if [[ $rebuild == 0 ]] && is_built; then
  print_result
  exit 0
fi

mkdir -p "$prefix"
exec 9>"$prefix/.lock"
if ! flock -w "${LOCKSTEP_KUBE_BUILD_LOCK_TIMEOUT:-1800}" 9; then
  say "timed out waiting for another build (lock $prefix/.lock)"
  exit 1
fi
# Another process may have built it while this one waited.
if [[ $rebuild == 0 ]] && is_built; then
  print_result
  exit 0
fi

as_root() {
  if [[ $(id -u) -eq 0 ]]; then "$@"
  elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then sudo "$@"
  else return 1
  fi
}

missing=()
for package in "${build_packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$package" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$package")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  say "installing build dependencies: ${missing[*]}"
  if ! as_root env DEBIAN_FRONTEND=noninteractive apt-get install -q -y --no-install-recommends \
      "${missing[@]}" >"$prefix/install.log" 2>&1; then
    tail -n 20 "$prefix/install.log" >&2
    say "cannot install ${missing[*]} (need root or passwordless sudo); install them and run again"
    exit 1
  fi
fi

# The Debian mirror of the system's deb822 sources, for the deb-src line.
mirror=http://deb.debian.org/debian
if [[ -r /etc/apt/sources.list.d/debian.sources ]]; then
  m=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
  [[ -n "$m" ]] && mirror=$m
fi

build=$(mktemp -d "$prefix/build.XXXXXX")
cleanup() { rm -rf "$build"; }
trap cleanup EXIT

# The build runs in its own bash so that `set -e` holds inside it (a compound command on the left
# of `||` would run with errexit off).
do_build() {
  set -x
  cd "$build"
  # A private apt state: the deb-src list, its index and cache live in the build directory.
  echo "deb-src [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] $mirror bookworm main" \
    >src.list
  mkdir -p lists/partial cache/archives/partial
  local apt_opts=(-o "Dir::Etc::SourceList=$build/src.list" -o Dir::Etc::SourceParts=/dev/null
                  -o "Dir::State::Lists=$build/lists" -o "Dir::Cache=$build/cache"
                  -o APT::Sandbox::User=root)
  apt-get "${apt_opts[@]}" update
  apt-get "${apt_opts[@]}" source --download-only "$debian_source"
  local dsc
  dsc=$(ls "$debian_source"_*.dsc)
  grep -q "really$version" <<<"$dsc" || { echo "unexpected source version: $dsc"; return 1; }
  dpkg-source -x "$dsc" src
  cd src

  # reflect2 1.0.1 -> 1.0.2 (Go >= 1.18 breaks 1.0.1's unsafe map access).
  rm -rf vendor/github.com/modern-go/reflect2
  mkdir -p vendor/github.com/modern-go/reflect2
  cp -rL "$reflect2_src"/. vendor/github.com/modern-go/reflect2/
  find vendor/github.com/modern-go/reflect2 -name '*_test.go' -delete
  sed -i 's|github.com/modern-go/reflect2 v1.0.1|github.com/modern-go/reflect2 v1.0.2|g' \
    go.mod vendor/modules.txt
  if grep -rn 'modern-go/reflect2 v1.0.1' go.mod vendor/modules.txt; then return 1; fi

  # Empty strings in custom resources: built with Go >= 1.16, OpenAPI validation takes "" for
  # null and refuses it ("must be of type string: \"null\"", kubernetes#99804). The upstream fix
  # (kube-openapi#230, in Kubernetes 1.20.5) drops the zero-value test; the same line in
  # go-openapi/validate gets the same fix.
  local file
  for file in vendor/k8s.io/kube-openapi/pkg/validation/validate/type.go \
              vendor/github.com/go-openapi/validate/type.go; do
    grep -q 'if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {' "$file"
    sed -i 's/if data == nil || reflect.DeepEqual(reflect.Zero(reflect.TypeOf(data)), reflect.ValueOf(data)) {/if data == nil {/' "$file"
  done

  # A lost node never tainted NoExecute, so its pods never evicted (kubernetes#94183, fixed by
  # kubernetes#96876 in 1.21 and backported; Debian's 1.20.2 predates it): markNodeForTainting
  # dropped a node from the tainting queue's set but not from its heap, so nodes that were
  # NotReady while the cluster came up could leave stale entries that the tainting pass never
  # removes, and a node lost later was never tainted. The fix removes both.
  file=pkg/controller/nodelifecycle/node_lifecycle_controller.go
  [[ $(grep -c 'zoneNoExecuteTainter\[utilnode.GetZoneKey(node)\].SetRemove(node.Name)' "$file") == 2 ]]
  sed -i 's/zoneNoExecuteTainter\[utilnode.GetZoneKey(node)\].SetRemove(node.Name)/zoneNoExecuteTainter[utilnode.GetZoneKey(node)].Remove(node.Name)/' "$file"

  # GOPATH mode, as Debian's own build (debian/rules) does.
  export GOPATH="$PWD/.go" GO111MODULE=off CGO_ENABLED=0 GOFLAGS=-p=2 GOCACHE="$build/gocache"
  export PATH="$goroot/bin:$PATH" HOME="$build/home"
  mkdir -p .go/src/k8s.io "$HOME"
  ln -s ../../.. .go/src/k8s.io/kubernetes
  nice -n 10 make gen_openapi
  local what="" program
  for program in $programs_list; do what+=" cmd/$program"; done
  nice -n 10 make WHAT="${what# }"
  # The version pause prints with -v is the one its upstream Makefile passes.
  local pause_version
  pause_version=$(awk -F' *[?:]?= *' '$1 == "TAG" { print $2; exit }' build/pause/Makefile)
  [[ -n "$pause_version" ]] || { echo "no TAG in build/pause/Makefile"; return 1; }
  gcc -Os -Wall -static -DVERSION="v$pause_version" -o _output/bin/pause \
    build/pause/linux/pause.c
  echo "$pause_version" >_output/bin/pause.version

  rm -rf "$bindir.new"
  mkdir -p "$bindir.new"
  for program in $programs_list pause pause.version; do cp "_output/bin/$program" "$bindir.new/"; done
  echo "$recipe" >"$bindir.new/recipe"
  rm -rf "$bindir"
  mv "$bindir.new" "$bindir"
}

start=$(date +%s)
say "building Kubernetes $version into $bindir (log: $log); this takes several minutes"
export -f do_build
programs_list="${programs[*]}"  # arrays do not cross into bash -c
export build mirror debian_source version reflect2_src goroot bindir recipe programs_list
if ! bash -euo pipefail -c do_build >"$log" 2>&1; then
  say "build failed after $(( $(date +%s) - start ))s; last lines of $log:"
  tail -n 30 "$log" >&2
  exit 1
fi
say "built in $(( $(date +%s) - start ))s"
echo "$(( $(date +%s) - start ))" >"$prefix/build-seconds"
is_built || { say "built binaries do not report v$version"; exit 1; }
print_result
