#!/usr/bin/env bash
# The exec agent's bundle (scripts/bundle/agent.sh) runs in a root that is not this machine's,
# bind-mounted at /lockstep as the operator mounts it (in a mount namespace of its own):
#   1. an empty root (no shell, no C library): lockstep-agent starts, and `install` copies the
#      whole bundle;
#   2. Debian trixie's root (scripts/trixie-torch.sh; glibc 2.41, GCC 14), with LD_PRELOAD naming
#      trixie's libstdc++, which needs glibc 2.38: the launcher keeps it from the agent's loader
#      and the agent starts; the agent without its launcher does not (so 2 proves something).
#
#   agent_bundle_test.sh BUNDLE TRIXIE_PYTHON
# Exit status: 0 pass, 1 fail, 77 skip (not root: namespaces and chroot; or no bundle: no patchelf).
set -euo pipefail

bundle=${1:?usage: agent_bundle_test.sh BUNDLE TRIXIE_PYTHON}
trixie_python=${2:?usage: agent_bundle_test.sh BUNDLE TRIXIE_PYTHON}
if [[ $(id -u) -ne 0 ]]; then echo "SKIP: needs root (mount namespaces, chroot)"; exit 77; fi
if [[ ! -f $bundle/BUNDLE-INFO ]]; then echo "SKIP: no bundle at $bundle (no patchelf)"; exit 77; fi

failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}
work=$(mktemp -d "${TMPDIR:-/tmp}/agent_bundle_test.XXXXXX")
made_mount_point=""
# The trixie root is scripts/trixie-torch.sh's cache: the mount point made in it goes again.
trap 'rm -rf "$work"; [[ -z $made_mount_point ]] || rmdir "$made_mount_point"' EXIT

# in_root ROOT [NAME=VALUE...] COMMAND...: COMMAND chrooted into ROOT, with the bundle at
# ROOT/lockstep (read-only, as in a pod) and /proc, in an empty environment but for the NAME=VALUE
# given. Output on stdout and stderr.
in_root() {
  local root=$1; shift
  unshare --mount --propagation private -- /bin/sh -c '
    root=$1; bundle=$2; shift 2
    mount --bind "$bundle" "$root/lockstep" && mount -o remount,bind,ro "$root/lockstep" &&
      mount -t proc proc "$root/proc" || exit 1
    variables=""
    while [ $# -gt 0 ] && [ "${1#*=}" != "$1" ]; do variables="$variables $1"; shift; done
    # shellcheck disable=SC2086  # one word per variable
    exec env -i $variables /usr/sbin/chroot "$root" "$@"' _ "$root" "$bundle" "$@"
}

# 1. An empty root.
empty=$work/empty
mkdir -p "$empty/lockstep" "$empty/proc" "$empty/volume"
if ! output=$(in_root "$empty" /lockstep/bin/lockstep-agent --help 2>&1); then
  fail "lockstep-agent --help in an empty root: $output"
elif [[ $output != *"lockstep-agent install DIR"* ]]; then
  fail "lockstep-agent --help in an empty root printed: $output"
fi
if ! output=$(in_root "$empty" /lockstep/bin/lockstep-agent install /volume 2>&1); then
  fail "lockstep-agent install in an empty root: $output"
elif ! cmp -s "$bundle/BUNDLE-INFO" "$empty/volume/BUNDLE-INFO" ||
     ! cmp -s "$bundle/bin/lockstep-agent-main" "$empty/volume/bin/lockstep-agent-main"; then
  fail "install copied an incomplete bundle: $(ls -R "$empty/volume" | head -20)"
else
  echo "ok: an empty root: the agent starts and installs itself ($output)"
fi

# 2. Debian trixie's root, with a preload built for its newer glibc.
trixie=$(dirname "$trixie_python")/root
if [[ ! -x $trixie/usr/bin/python3 ]]; then
  fail "no trixie root at $trixie (scripts/trixie-torch.sh makes it)"
else
  if [[ ! -d $trixie/lockstep ]]; then
    mkdir "$trixie/lockstep"
    made_mount_point=$trixie/lockstep
  fi
  preload=/usr/lib/x86_64-linux-gnu/libstdc++.so.6
  if ! output=$(in_root "$trixie" LD_PRELOAD=$preload /lockstep/bin/lockstep-agent \
                  --help 2>&1); then
    fail "lockstep-agent with LD_PRELOAD=$preload in trixie's root: $output"
  else
    echo "ok: trixie's root with LD_PRELOAD=$preload: the agent starts"
  fi
  if output=$(in_root "$trixie" LD_PRELOAD=$preload /lockstep/bin/lockstep-agent-main \
                --help 2>&1); then
    fail "the agent without its launcher started with LD_PRELOAD=$preload: the test proves nothing"
  elif [[ $output != *GLIBC_2.3* ]]; then
    fail "the agent without its launcher failed otherwise than expected: $output"
  else
    echo "ok: without the launcher it fails: ${output%%$'\n'*}"
  fi
fi

((failures == 0)) || exit 1
echo "PASS"
