# The images: a debian:bookworm base made by mmdebstrap from Debian's package registry (no
# public image registry is reachable here), the Dockerfile's operator, worker-cpu and agent
# targets built on it with buildah, and the pause image from the pause program Kubernetes' source
# builds; and, for `build-image`, any Dockerfile of a user's on a bookworm or trixie base.
# Each is cached as a docker-archive under $cache/images, keyed by what it is made from, and
# imported into every node's containerd. Sourced.

images=$cache/images
readonly image_registry=localhost/lockstep
readonly image_tag=dev
operator_image=$image_registry/lockstep-operator:$image_tag
worker_image=$image_registry/lockstep-worker-cpu:$image_tag
agent_image=$image_registry/lockstep-agent:$image_tag

# TMPDIR: where buildah keeps RUN --mount=type=cache folders (the Dockerfile's ccache), so they
# live with the images' cache rather than in /var/tmp.
buildah_() {
  mkdir -p "$images/tmp"
  TMPDIR=$images/tmp buildah --root "$images/storage" --runroot "$images/run" \
    --storage-driver overlay "$@"
}

debian_mirror() {
  local m=""
  [[ -r /etc/apt/sources.list.d/debian.sources ]] &&
    m=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
  echo "${m:-http://deb.debian.org/debian}"
}

# A base: Debian RELEASE's minbase with apt, tagged as both images a Dockerfile starts from
# (debian:RELEASE for build stages, debian:RELEASE-slim for runtime ones; slim differs only by
# leaving out documentation, as this one does). bookworm for the project's images; trixie for the
# examples' own images (examples/pytorch/Dockerfile), as a user's would be.
build_base_image() {
  local suite=${1:-bookworm}
  local key="$suite-$(date +%Y%m)"  # a month's package updates at most
  local labels
  labels=$(buildah_ inspect --type image --format '{{.OCIv1.Config.Labels}}' \
             "docker.io/library/debian:$suite-slim" 2>/dev/null || true)
  [[ "$labels" == *"lockstep.base:$key"* ]] && return 0
  say "making debian:$suite with mmdebstrap ($(debian_mirror))"
  local tar="$images/debian-$suite.tar"
  mmdebstrap --variant=minbase --quiet \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    "$suite" "$tar" "deb $(debian_mirror) $suite main" >"$images/mmdebstrap.log" 2>&1 ||
    { tail -n 20 "$images/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  local container
  container=$(buildah_ from scratch)
  buildah_ add "$container" "$tar" / >/dev/null
  buildah_ config --label "lockstep.base=$key" --cmd /bin/bash \
    --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "$container"
  buildah_ commit --quiet --rm "$container" "docker.io/library/debian:$suite-slim" >/dev/null
  buildah_ tag "docker.io/library/debian:$suite-slim" "docker.io/library/debian:$suite"
  rm -f "$tar"
}

# The build context's fingerprint: the content of every file `git ls-files` gives (tracked and
# untracked, not ignored) except those .dockerignore keeps out of the context by name, with its
# exceptions ("!scripts/bundle") back in.
context_key() {
  local excluded included
  excluded=$(grep -v '^#' "$repo/.dockerignore" | grep -v '^!' | grep -v '[*?]' | grep . |
               sed 's|/$||' | paste -sd'|')
  included=$(grep '^!' "$repo/.dockerignore" | sed 's|^!||; s|/$||' | paste -sd'|')
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
     awk -v RS='\0' -v ORS='\0' -v excluded="^($excluded)(/|$)" \
         -v included="${included:+^($included)(/|$)}" \
         '$0 !~ excluded || (included != "" && $0 ~ included)' |
     sort -z | xargs -0 sha256sum 2>/dev/null | sha256sum | cut -c1-16)
}

# build_image TARGET NAME: the Dockerfile's TARGET as image NAME, in $images/TARGET-KEY.tar.
build_image() {
  local target=$1 name=$2 key archive
  key=$(context_key)
  archive="$images/$target-$key.tar"
  if [[ -s "$archive" ]]; then echo "$archive"; return 0; fi
  build_base_image bookworm
  say "building the Dockerfile's $target target with buildah (log: $images/$target.log)"
  local start=$SECONDS
  if ! buildah_ bud --isolation chroot --network host --layers --pull=never \
      --target "$target" -t "$name" -f "$repo/Dockerfile" "$repo" >"$images/$target.log" 2>&1; then
    tail -n 30 "$images/$target.log" >&2
    die "building $target failed"
  fi
  rm -f "$images/$target"-*.tar
  buildah_ push --quiet "$name" "docker-archive:$archive.tmp:$name" >/dev/null
  mv "$archive.tmp" "$archive"
  say "$target built in $((SECONDS - start))s"
  echo "$archive"
}

# The pause image: Kubernetes' pause program (scripts/kubernetes.sh builds it) alone.
pause_image=$image_registry/pause:3.4
build_pause_image() {
  local archive="$images/pause-$(sha256sum "$k8s_bin/pause" | cut -c1-16).tar"
  if [[ ! -s "$archive" ]]; then
    local container
    container=$(buildah_ from scratch)
    buildah_ copy "$container" "$k8s_bin/pause" /pause >/dev/null
    buildah_ config --entrypoint '["/pause"]' --user 65535:65535 "$container"
    buildah_ commit --quiet --rm "$container" "$pause_image" >/dev/null
    rm -f "$images"/pause-*.tar
    buildah_ push --quiet "$pause_image" "docker-archive:$archive.tmp:$pause_image" >/dev/null
    mv "$archive.tmp" "$archive"
  fi
  echo "$archive"
}

build_images() {
  mkdir -p "$images"
  image_archives=()
  local archive
  archive=$(build_pause_image) && image_archives+=("$archive") || die "no pause image"
  archive=$(build_image operator "$operator_image") && image_archives+=("$archive") || exit 1
  archive=$(build_image worker-cpu "$worker_image") && image_archives+=("$archive") || exit 1
  archive=$(build_image agent "$agent_image") && image_archives+=("$archive") || exit 1
}

# build_context_image DIR NAME: the Dockerfile in DIR (its folder the context; FROM debian:
# bookworm or trixie, which build_base_image makes) as image NAME, in
# $images/context-NAME-KEY.tar (an older archive of NAME is removed),
# KEY from the folder's content and the month (apt's packages). Prints the archive's path. How the
# tests and `cluster.sh build-image` build an image of a user's, such as examples/pytorch's.
build_context_image() {
  local dir=$1 name=$2 key archive suite
  [[ -f "$dir/Dockerfile" ]] || die "no Dockerfile in $dir"
  key=$( (cd "$dir" && find . -type f -print0 | sort -z | xargs -0 sha256sum; echo "$name";
          date +%Y%m) | sha256sum | cut -c1-16)
  local stem="context-$(tr -c 'a-zA-Z0-9._-' '_' <<<"$name" | sed 's/_$//')"
  archive="$images/$stem-$key.tar"
  if [[ -s "$archive" ]]; then echo "$archive"; return 0; fi
  mkdir -p "$images"
  suite=$(sed -n 's/^FROM debian:\([a-z]*\).*/\1/p' "$dir/Dockerfile" | head -n 1)
  [[ -n "$suite" ]] && build_base_image "$suite"
  say "building $name from $dir/Dockerfile with buildah (log: $images/$stem.log)"
  local start=$SECONDS
  if ! buildah_ bud --isolation chroot --network host --layers --pull=never \
      -t "$name" -f "$dir/Dockerfile" "$dir" >"$images/$stem.log" 2>&1; then
    tail -n 30 "$images/$stem.log" >&2
    die "building $name failed"
  fi
  # The same image from an older context (its key is 16 hex digits: not another image's name).
  rm -f "$images/$stem"-????????????????.tar
  buildah_ push --quiet "$name" "docker-archive:$archive.tmp:$name" >/dev/null
  mv "$archive.tmp" "$archive"
  say "$name built in $((SECONDS - start))s"
  echo "$archive"
}

# Imports the archives into NODE's containerd, in the namespace the CRI uses.
load_images() {
  local node=$1 archive
  for archive in "${image_archives[@]}"; do
    node_exec "$node" ctr --namespace k8s.io images import "$archive" >/dev/null ||
      die "importing $archive into $node failed"
  done
}
