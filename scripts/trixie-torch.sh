#!/usr/bin/env bash
# PyTorch 2.6 from Debian trixie (13, the current stable release) beside this machine's bookworm
# torch 1.13, for the exec-mode tests: a trixie root made once with mmdebstrap (python3-torch,
# python3-numpy, dataset-fashion-mnist; about 1.1 GB, 1.5 minutes here), cached outside the
# repository, and a `python3` beside it that runs the root's interpreter on this machine's files.
# Prints that python3's path.
#
#   scripts/trixie-torch.sh            # make it when missing (needs root), print .../python3
#   scripts/trixie-torch.sh --rebuild  # make it again
#
# The python3 wrapper: in a mount namespace of its own, the root's /usr and /etc are bind-mounted
# over this machine's, and the root's /usr/bin/python3 is executed in place of the wrapper (same
# process, so signals and the agent's process group reach it). Everything else is this machine's
# at its own path: the checkout, the build, /tmp, /dev/shm, /proc, the working directory. So a
# test hands it the same script paths and environment as Debian's python3. Needs root (mount
# namespaces); without it the wrapper fails and the torch tests that use it skip.
#
# Cache: ${LOCKSTEP_CACHE_DIR:-$HOME/.cache/lockstep}/trixie-torch/ (root/, python3, KEY), keyed
# by the package list and the month (a month's package updates at most). Debian's archive is
# reached through mmdebstrap's own apt configuration: the system's sources are left alone.
set -euo pipefail

readonly packages=(python3-torch python3-numpy dataset-fashion-mnist)
cache=${LOCKSTEP_CACHE_DIR:-${HOME:-/tmp}/.cache/lockstep}/trixie-torch
key="trixie $(date +%Y%m) ${packages[*]}"

say() { echo "trixie-torch.sh: $*" >&2; }
die() { say "$*"; exit 1; }

rebuild=0
case "${1:-}" in
  --rebuild) rebuild=1 ;;
  "") ;;
  *) die "unknown argument: $1 (expected --rebuild or nothing)" ;;
esac

made() { [[ -x "$cache/python3" && "$(cat "$cache/KEY" 2>/dev/null)" == "$key" ]]; }
if ((rebuild == 0)) && made; then
  echo "$cache/python3"
  exit 0
fi
[[ $(id -u) -eq 0 ]] || die "needs root (mmdebstrap, and mount namespaces for the wrapper)"
command -v mmdebstrap >/dev/null || die "needs mmdebstrap (scripts/setup.sh installs it)"

mirror=""
[[ -r /etc/apt/sources.list.d/debian.sources ]] &&
  mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources)
mirror=${mirror:-http://deb.debian.org/debian}

# A second caller waits for the first instead of making it twice.
mkdir -p "$(dirname "$cache")"
exec 9>"$cache.lock"
flock -w 1800 9 || die "another trixie-torch.sh has held $cache.lock for 30 minutes"
if ((rebuild == 0)) && made; then
  echo "$cache/python3"
  exit 0
fi

say "making a Debian trixie root with ${packages[*]} from $mirror into $cache (about 1.1 GB)"
start=$SECONDS
rm -rf "$cache.new"
mkdir -p "$cache.new"
trap 'rm -rf "$cache.new"' EXIT  # a failed attempt leaves nothing of its 1.1 GB
mmdebstrap --variant=apt --quiet --include="$(IFS=,; echo "${packages[*]}")" \
  --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  trixie "$cache.new/root" "deb $mirror trixie main" >"$cache.new/mmdebstrap.log" 2>&1 ||
  { tail -n 20 "$cache.new/mmdebstrap.log" >&2; die "mmdebstrap failed"; }

# The host's mount binds /etc first and /usr last: after that, only the root's programs run.
cat >"$cache.new/python3" <<'WRAPPER'
#!/bin/sh
# Debian trixie's python3 (torch 2.6) on this machine's files: made by scripts/trixie-torch.sh.
root=$(cd "$(dirname "$0")" && pwd)/root
# What an image of trixie's torch sets (examples/pytorch/Dockerfile): Debian builds it without
# libuv, which torch 2.4 on asks env:// rendezvous for by default.
export USE_LIBUV="${USE_LIBUV:-0}"
exec unshare --mount --propagation private -- /bin/sh -c '
  mount --bind "$0/etc" /etc && mount --bind "$0/usr" /usr && exec /usr/bin/python3 "$@"' \
  "$root" "$@"
WRAPPER
chmod 0755 "$cache.new/python3"
version=$("$cache.new/python3" -c \
            'import sys, torch; print(sys.version.split()[0], torch.__version__)') ||
  die "the trixie root's python3 cannot import torch (see above)"
echo "$key" >"$cache.new/KEY"
# The old root moves aside before the new one takes its name, then goes: a test still running
# on it keeps its files until then.
rm -rf "$cache.old"
[[ -e $cache ]] && mv "$cache" "$cache.old"
mv "$cache.new" "$cache"
trap - EXIT
rm -rf "$cache.old"
say "made in $((SECONDS - start)) s: Python and torch $version"
echo "$cache/python3"
