#!/usr/bin/env bash
# The exec agent as one self-contained folder, for a user's own image (docs/exec.md, "Your own
# image"): the operator's init container copies it into a volume the pod shares, and the user's
# container runs PREFIX/bin/lockstep-agent exec -- COMMAND.
#
#   scripts/bundle/agent.sh --out DIR [--prefix /lockstep] LAUNCHER PROGRAM HELPERS
#
#   LAUNCHER  the built lockstep-agent-launcher (worker/agent_launcher.cc, linked statically)
#   PROGRAM   the built lockstep-agent (worker/agent_main.cc)
#   HELPERS   the folder of Lockstep's Python helpers (python/lockstep)
#   --prefix  where the folder will be in the pod (default /lockstep, the operator's mount path)
#
# DIR gets (replaced whole; written beside it and renamed, so a reader never sees half of it):
#   bin/lockstep-agent              LAUNCHER: moves the image's LD_* variables out of the way of
#                                   the agent's loader, then executes the agent beside it
#   bin/lockstep-agent-main         PROGRAM with its debug info stripped; its loader (PT_INTERP) is
#                                   PREFIX/lib/ld-linux-x86-64.so.2, its RPATH $ORIGIN/../lib and
#                                   PREFIX/lib (where no /proc gives the loader $ORIGIN)
#   lib/                            every library it links, glibc and its loader included
#   lib/lockstep/python/lockstep/   the helpers (`from lockstep import progress, elastic`): the
#                                   agent finds them beside its bin/ and adds them to PYTHONPATH
#   BUNDLE-INFO                     key=value lines: prefix, program, libraries, the glibc bundled
#
# Why glibc and its loader: a user's image has its own glibc (Ubuntu 24.04: 2.39; Debian trixie:
# 2.41; a distroless or scratch image: none), and a program runs only on the glibc it was built
# for or a newer one. With its own loader named in the program, the agent loads nothing of the
# image: it runs in any Linux image of the same CPU architecture, with or without a shell or a C
# library. Nothing of this reaches the user's command: it is started with execve, which loads it
# with the image's own loader and libraries, and the agent sets no loader variable. The image's
# own LD_PRELOAD or LD_LIBRARY_PATH (a preloaded allocator, CUDA's folders) would be obeyed by the
# agent's loader too, and what they name is built for the image's glibc: the static launcher
# parks them, and the agent gives them back to the programs it starts.
#
# Why RPATH rather than RUNPATH: the loader searches a program's DT_RPATH before LD_LIBRARY_PATH,
# which many images set (NVIDIA's CUDA images do), and applies the program's DT_RPATH to the
# libraries' own needs too; RUNPATH comes after LD_LIBRARY_PATH and serves the program alone.
#
# Then it checks the folder: the bundled loader lists the agent's libraries with LD_LIBRARY_PATH
# naming this machine's library folders, and every one must resolve inside DIR/lib; and it starts
# the agent (--help) with an empty environment. Exit status: 0 made and checked, 1 a failure
# (named on stderr), 2 bad usage.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck source=libraries.sh
source "$root/scripts/bundle/libraries.sh"

log() { echo "agent-bundle: $*"; }
die() {
  echo "agent-bundle: error: $*" >&2
  exit 1
}
usage() {
  sed -n '6,11p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

out="" prefix=/lockstep positional=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --prefix) prefix=${2:?--prefix needs a path}; shift 2 ;;
    -h | --help) usage ;;
    -*) echo "agent-bundle: unknown option $1" >&2; usage ;;
    *) positional+=("$1"); shift ;;
  esac
done
[[ -n $out && ${#positional[@]} -eq 3 ]] || usage
launcher=${positional[0]}
program=${positional[1]}
helpers=${positional[2]}
[[ $prefix == /* ]] || die "--prefix $prefix: not an absolute path"
[[ -x $program ]] || die "no program at $program: build lockstep-agent first"
[[ -x $launcher ]] || die "no launcher at $launcher: build lockstep-agent-launcher first"
[[ -z $(program_interpreter "$launcher") ]] ||
  die "$launcher names a loader: it must be linked statically (no loader may read its LD_*)"
[[ -f $helpers/__init__.py ]] || die "$helpers holds no Python package (no __init__.py)"
command -v patchelf >/dev/null || die "needs patchelf (scripts/setup.sh installs it)"

out=$(mkdir -p "$(dirname "$out")" && cd "$(dirname "$out")" && pwd -P)/$(basename "$out")
stage=$(mktemp -d "$out.partial.XXXXXX")
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib/lockstep/python/lockstep"

name=$(basename "$program")
strip --strip-debug -o "$stage/bin/lockstep-agent-main" "$program"
strip --strip-debug -o "$stage/bin/lockstep-agent" "$launcher"
interpreter=$(program_interpreter "$program")
[[ -n $interpreter && -f $interpreter ]] || die "$program names no loader this machine has"
loader_name=$(basename "$interpreter")
cp -L "$interpreter" "$stage/lib/$loader_name"

libraries=()
while read -r library path; do
  [[ $path != not-found ]] || die "$program needs $library, which is not found on this machine"
  is_cuda "$library" && die "$program links $library: the agent must be built without CUDA"
  cp -L "$path" "$stage/lib/$library"
  libraries+=("$library")
done < <(resolved_libraries "$program")

# $ORIGIN needs /proc (the loader reads /proc/self/exe); the prefix serves where it is not mounted.
patchelf --set-interpreter "$prefix/lib/$loader_name" --force-rpath \
  --set-rpath "\$ORIGIN/../lib:$prefix/lib" "$stage/bin/lockstep-agent-main"
for library in "${libraries[@]}"; do
  # glibc's own parts need only each other, found through the program's RPATH; patching them
  # would change nothing and risk a library the loader treats specially.
  is_glibc "$library" && continue
  patchelf --force-rpath --set-rpath "\$ORIGIN:$prefix/lib" "$stage/lib/$library"
done
find "$helpers" -maxdepth 1 -name '*.py' -exec cp {} "$stage/lib/lockstep/python/lockstep/" \;
chmod -R u=rwX,go=rX "$stage"
chmod 0755 "$stage/bin/lockstep-agent" "$stage/bin/lockstep-agent-main" "$stage/lib/"*.so*

glibc_version=$("$stage/lib/$loader_name" --version 2>/dev/null |
                sed -n '1s/.*release version \([0-9.]*[0-9]\).*/\1/p')
bytes=$(du -sb "$stage" | cut -f1)
{
  echo "prefix=$prefix"
  echo "program=bin/lockstep-agent (launcher) and bin/lockstep-agent-main (from $name)"
  echo "loader=lib/$loader_name"
  echo "glibc=${glibc_version:-unknown}"
  echo "libraries=$(printf '%s\n' "${libraries[@]}" | sort | paste -sd ' ')"
  echo "bytes=$bytes"
} >"$stage/BUNDLE-INFO"

# The check: the bundled loader resolves every library inside lib/, even with LD_LIBRARY_PATH
# naming this machine's folders (as an image's environment may), and the agent starts.
problems=()
system_dirs=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu:/lib64:/usr/lib64
listing=$(env -i LD_LIBRARY_PATH="$system_dirs" LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes \
  LD_BIND_NOW=yes "$stage/lib/$loader_name" "$stage/bin/lockstep-agent-main" 2>&1) ||
  problems+=("the bundled loader cannot list the agent's libraries: $listing")
while read -r library arrow path _; do
  [[ $arrow == "=>" ]] || continue
  case $(realpath -m "$path") in
    "$stage/lib/"*) ;;
    *) problems+=("$library resolves outside the bundle: $path") ;;
  esac
done <<<"$listing"
if grep -q "not found" <<<"$listing"; then
  problems+=("$(grep "not found" <<<"$listing" | head -n 5)")
fi
if ! output=$(env -i "$stage/lib/$loader_name" "$stage/bin/lockstep-agent-main" --help 2>&1); then
  problems+=("lockstep-agent --help failed: $(head -c 400 <<<"$output")")
fi
if ((${#problems[@]} > 0)); then
  printf 'agent-bundle: check FAILED: %s\n' "${problems[@]}" >&2
  exit 1
fi

rm -rf "$out.old"
[[ -e $out ]] && mv "$out" "$out.old"
mv "$stage" "$out"
rm -rf "$out.old"
trap - EXIT
log "$out: lockstep-agent and ${#libraries[@]} libraries (glibc ${glibc_version:-unknown}" \
  "with its loader), $((bytes / 1024)) KiB; loader $prefix/lib/$loader_name"
