#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh needs on a lent GPU machine into one archive, then checks the
# archive with the dynamic loader.
#
#   scripts/gpu-bundle.sh [BUILD_DIR]            pack BUILD_DIR/bin (default build/) into
#                                                gpu-bundle/lockstep-gpu-bundle.tar.xz and check it
#   scripts/gpu-bundle.sh --out DIR [BUILD_DIR]  write the archive into DIR instead
#   scripts/gpu-bundle.sh --check ARCHIVE        only check an existing archive
#
# Why: the GPU machines have CUDA 13, cuBLAS, NCCL and PyTorch but none of the Debian libraries
# Lockstep links (gRPC, protobuf, yaml-cpp, cpprestsdk, prometheus-cpp, Gloo, OpenBLAS, ...), and
# reach no package registry. They receive the working tree plus the git-ignored folders named to
# the device tool, 64 MiB in all, so the archive must stay under 60 MiB (the tracked tree is
# about 3.5 MiB).
#
# The check's own program (scripts/gpu-check.sh and scripts/gpu_check/, Python's standard library
# only) is not in the archive: it travels with the working tree the device tool copies.
#
# Layout of the archive (unpacked by gpu-check.sh into /tmp/lockstep-gpu):
#   bin/                 lockstep, lockstep-worker and every GPU test or benchmark program that
#                        the build has (list below); stripped of debug info, RUNPATH $ORIGIN/../lib
#   lib/                 every shared library they need, under the name they need it by (its
#                        SONAME), except glibc's, CUDA's, NCCL's and the driver's, which the GPU
#                        machine must provide, and the GCC runtime (next line)
#   lib/gcc-fallback/    libstdc++.so.6 and libgcc_s.so.1 of this build machine: gpu-check.sh adds
#                        them to the search path only when the GPU machine's own are missing or
#                        too old (see "The GCC runtime" below)
#   data/fashion-mnist/  the four .gz files of Debian's dataset-fashion-mnist
#   examples/, bench/, tests/python/  the files of extra_files below, at their repository paths
#   BUNDLE-INFO          key=value lines: commit, programs, bundled libraries, the CUDA libraries
#                        the GPU machine must provide, the newest glibc symbol version needed
#
# The GCC runtime. Debian bookworm's libstdc++ (GCC 12) itself needs glibc 2.36 (arc4random),
# while our programs and the other bundled libraries need at most the glibc 2.34 symbols; an
# Ubuntu 22.04 machine (glibc 2.35) could run them with its own libstdc++ (GCC 12 as well) but
# not with ours. A newer machine's libstdc++ serves programs built with an older GCC (the library
# is backward compatible), and cuBLAS or NCCL, loaded into the same process, may need the newer
# one. So the machine's own GCC runtime is preferred, and ours is only a fallback.
#
# The check unpacks the archive into a temporary folder and asks the loader (tracing as `ldd -r`
# does, with an empty environment and LD_LIBRARY_PATH naming only the bundle and this machine's
# CUDA folder) where each program's libraries resolve: any library other than glibc's,
# CUDA's/NCCL's and the GCC runtime that is not found, or is found outside the bundle's lib/,
# fails the check, as does a missing symbol or symbol version. A second pass puts
# lib/gcc-fallback on the path and requires the GCC runtime to come from there. Then each program
# is started once from the unpacked bundle (`--help`, `--gtest_list_tests`), so that relocation
# and symbol binding happen for real.
#
# Exit status: 0 packed and checked; 1 a failure (named on stderr).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly root
readonly archive_name=lockstep-gpu-bundle.tar.xz
readonly max_archive_mib=60
# Always bundled (required) and bundled when built (the GPU tests and benchmarks; some are built
# only with nvcc, trainer_device_test and train_step_bench are new).
readonly required_programs=(lockstep lockstep-worker)
readonly optional_programs=(cuda_kernels_test comm_nccl_communicator_test kernels_test
  kernels_cuda_bench trainer_device_test train_step_bench in_place_recovery_test)
readonly dataset_dir=/usr/share/datasets/fashion-mnist
readonly dataset_files=(train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz
  t10k-images-idx3-ubyte.gz t10k-labels-idx1-ubyte.gz)
# Exec mode on the GPU machine's PyTorch: the DDP example, the helpers' Python tests (which
# import them from ../../python) and the goodput benchmark (scripts/gpu_check, step g).
readonly extra_files=(examples/fashion-mnist.yaml bench/train_step/torch_step.py
  examples/pytorch/train_ddp.py tests/python/test_elastic.py tests/python/test_progress.py
  tests/python/test_zygote.py python/lockstep/__init__.py python/lockstep/elastic.py
  python/lockstep/progress.py python/lockstep/zygote.py bench/exec_goodput/run.py
  bench/benchlib.py)

# Temporary folders, removed however the script ends. (Not created in a $(...) subshell: the
# list must grow in this shell for the trap to see it.)
temporary_dirs=()
trap 'rm -rf "${temporary_dirs[@]}"' EXIT
new_temporary_dir() {  # sets temporary_dir to a new folder
  temporary_dir=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-gpu-bundle.XXXXXX")
  temporary_dirs+=("$temporary_dir")
}

log() { echo "gpu-bundle: $*"; }
die() {
  echo "gpu-bundle: error: $*" >&2
  exit 1
}

usage() {
  sed -n '2,8p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
}

# is_glibc, is_cuda, is_gcc_runtime, resolved_libraries, program_interpreter and
# newest_glibc_version_needed: shared with the exec agent's bundle (scripts/bundle/agent.sh).
# shellcheck source=bundle/libraries.sh
source "$root/scripts/bundle/libraries.sh"

# Checks an archive with the loader (see the header). Prints what it checked; returns 1 and names
# every problem when there is one.
check_archive() {
  local archive=$1
  [[ -f $archive ]] || die "no archive at $archive"
  new_temporary_dir
  local unpacked=$temporary_dir
  tar -C "$unpacked" -xJf "$archive" || die "cannot unpack $archive"
  [[ -f $unpacked/BUNDLE-INFO ]] || die "$archive has no BUNDLE-INFO: not made by this script"

  # This machine's CUDA folders (recorded at packing), so that the CUDA libraries resolve here as
  # they will there; none when this machine has no CUDA (those libraries are then only noted).
  local cuda_dirs
  cuda_dirs=$(sed -n 's/^build_cuda_dirs=//p' "$unpacked/BUNDLE-INFO")
  local loader
  loader=$(program_interpreter "$unpacked/bin/lockstep")
  [[ -x $loader ]] || die "the loader $loader named by bin/lockstep is not on this machine"

  local problems=() program pass library_path line name path
  for program in "$unpacked"/bin/*; do
    for pass in own-gcc-runtime gcc-fallback; do
      library_path=$unpacked/lib
      [[ $pass == gcc-fallback ]] && library_path+=:$unpacked/lib/gcc-fallback
      [[ -n $cuda_dirs ]] && library_path+=:$cuda_dirs
      # What `ldd -r` does: trace instead of running, bind every symbol now and warn about
      # those that are missing. (`ld.so --list` stops at the first library it cannot find.)
      local listing cuda_missing=""
      listing=$(env -i LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes LD_BIND_NOW=yes \
        LD_LIBRARY_PATH="$library_path" "$loader" "$program" 2>&1) || true
      while IFS= read -r line; do
        if [[ $line == *"version \`"*"' not found"* ]]; then
          problems+=("$(basename "$program") ($pass): ${line#*: }")
          continue
        fi
        if [[ $line == *"undefined symbol: "* ]]; then
          # Expected when a CUDA library is absent (its symbols are then missing too).
          [[ -z $cuda_missing ]] &&
            problems+=("$(basename "$program") ($pass): ${line#"${line%%[![:space:]]*}"}")
          continue
        fi
        [[ $line =~ ^[[:space:]]*([^[:space:]]+)\ =\>\ ([^[:space:]]+) ]] || continue
        name=${BASH_REMATCH[1]}
        path=${BASH_REMATCH[2]}
        if [[ $path == not ]]; then
          if is_cuda "$name"; then
            cuda_missing=$name
            [[ $pass == own-gcc-runtime ]] && log "note: $name (CUDA) is not on this machine;" \
              "$(basename "$program") takes it from the GPU machine"
          else
            problems+=("$(basename "$program") ($pass): $name not found")
          fi
        elif is_glibc "$name" || is_cuda "$name"; then
          :
        elif is_gcc_runtime "$name"; then
          if [[ $pass == gcc-fallback && $(dirname "$path") != "$unpacked/lib/gcc-fallback" ]]; then
            problems+=("$(basename "$program") ($pass): $name resolves outside the bundle: $path")
          fi
        elif [[ $(dirname "$path") != "$unpacked/lib" ]]; then
          problems+=("$(basename "$program") ($pass): $name resolves outside the bundle: $path")
        fi
      done <<<"$listing"
    done
  done

  # Start each program once from the bundle: relocation and symbol binding happen for real.
  local output args=()
  for program in "$unpacked"/bin/*; do
    case $(basename "$program") in
      lockstep | lockstep-worker) args=(--help) ;;
      train_step_bench | kernels_cuda_bench) continue ;;  # no side-effect-free flag promised
      *) args=(--gtest_list_tests) ;;
    esac
    if ! output=$(env -i LD_LIBRARY_PATH="$unpacked/lib${cuda_dirs:+:$cuda_dirs}" \
      "$program" "${args[@]}" 2>&1 </dev/null); then
      if [[ -z $cuda_dirs &&
        $output =~ "error while loading shared libraries: lib"(cuda|nccl|cublas) ]]; then
        log "note: $(basename "$program") not started: no CUDA libraries on this machine"
      else
        problems+=("$(basename "$program") ${args[*]}: exit status non-zero:" \
          "$(head -c 400 <<<"$output")")
      fi
    fi
  done

  if [[ ${#problems[@]} -gt 0 ]]; then
    printf 'gpu-bundle: check FAILED: %s\n' "${problems[@]}" >&2
    return 1
  fi
  log "loader check passed: $(find "$unpacked/bin" -type f | wc -l) programs resolve every" \
    "library other than glibc's, CUDA's and the GCC runtime inside the bundle" \
    "($(find "$unpacked/lib" -maxdepth 1 -type f | wc -l) libraries), and start"
}

pack() {
  local build_dir=$1 out_dir=$2
  local bin_dir=$build_dir/bin
  if [[ ! -x $bin_dir/lockstep-worker || ! -x $bin_dir/lockstep ]]; then
    die "$bin_dir has no lockstep or lockstep-worker: build first (scripts/build.sh)"
  fi
  local file
  for file in "${dataset_files[@]}"; do
    [[ -f $dataset_dir/$file ]] || die "$dataset_dir/$file is missing (scripts/setup.sh installs" \
      "dataset-fashion-mnist)"
  done
  for file in "${extra_files[@]}"; do
    [[ -f $root/$file ]] || die "$root/$file is missing"
  done

  new_temporary_dir
  local stage=$temporary_dir
  mkdir -p "$stage/bin" "$stage/lib/gcc-fallback" "$stage/data/fashion-mnist"

  local programs=() program
  programs=("${required_programs[@]}")
  for program in "${optional_programs[@]}"; do
    if [[ -x $bin_dir/$program ]]; then
      programs+=("$program")
    else
      log "not built, left out: $program"
    fi
  done

  # Debug info is most of each program's size; the symbol table stays, so that stack traces
  # (absl's failure signal handler, gtest death tests) still name functions.
  local patchelf_note="RUNPATH \$ORIGIN/../lib (patchelf)"
  if ! command -v patchelf >/dev/null; then
    patchelf_note="build RUNPATH kept: no patchelf (scripts/setup.sh installs it);"
    patchelf_note+=" gpu-check.sh sets LD_LIBRARY_PATH"
  fi
  for program in "${programs[@]}"; do
    strip --strip-debug -o "$stage/bin/$program" "$bin_dir/$program"
    if command -v patchelf >/dev/null; then
      # RUNPATH is not transitive (it serves the program's own needs, not those of its libraries),
      # so gpu-check.sh sets LD_LIBRARY_PATH all the same; this removes the build machine's CUDA
      # folder from the programs and lets their direct needs resolve from the bundle.
      # shellcheck disable=SC2016  # $ORIGIN is for the loader, not the shell
      patchelf --set-rpath '$ORIGIN/../lib' "$stage/bin/$program"
    fi
  done
  log "programs: ${programs[*]} ($patchelf_note)"
  # The exec agent's Python helpers, where it looks for them: lib/lockstep/python beside bin/.
  mkdir -p "$stage/lib/lockstep/python"
  cp -r "$root/python/lockstep" "$stage/lib/lockstep/python/"

  # Every library of every program, by the name it is needed by; each copied once.
  local -A bundled=() cuda_needed=() cuda_dirs=()
  local name path
  for program in "${programs[@]}"; do
    while read -r name path; do
      if is_glibc "$name"; then
        continue
      elif is_cuda "$name"; then
        cuda_needed[$name]=1
        [[ $path != not-found ]] && cuda_dirs[$(dirname "$path")]=1
        continue
      elif [[ $path == not-found ]]; then
        die "$program needs $name, which is not found on this machine"
      elif [[ -n ${bundled[$name]:-} ]]; then
        continue
      elif is_gcc_runtime "$name"; then
        cp -L "$path" "$stage/lib/gcc-fallback/$name"
      else
        cp -L "$path" "$stage/lib/$name"
      fi
      bundled[$name]=$path
    done < <(resolved_libraries "$bin_dir/$program")
  done
  find "$stage/lib" -type f -exec chmod 0755 {} +

  for file in "${dataset_files[@]}"; do
    cp "$dataset_dir/$file" "$stage/data/fashion-mnist/"
  done
  for file in "${extra_files[@]}"; do
    mkdir -p "$stage/$(dirname "$file")"
    cp "$root/$file" "$stage/$file"
  done

  local commit dirty=""
  commit=$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)
  if [[ -n $(git -C "$root" status --porcelain --untracked-files=no 2>/dev/null) ]]; then
    dirty=" (with uncommitted changes)"
  fi
  local -a lib_files=()
  mapfile -t lib_files < <(find "$stage/bin" "$stage/lib" -maxdepth 1 -type f)
  {
    echo "commit=$commit$dirty"
    echo "packed_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "build_dir=$build_dir"
    echo "programs=${programs[*]}"
    echo "libraries=$(find "$stage/lib" -maxdepth 1 -type f -printf '%f\n' | sort | paste -sd ' ')"
    echo "gcc_fallback=$(find "$stage/lib/gcc-fallback" -type f -printf '%f\n' | sort |
      paste -sd ' ')"
    echo "cuda_libraries=$(printf '%s\n' "${!cuda_needed[@]}" | sort | tr '\n' ' ')"
    echo "build_cuda_dirs=$(printf '%s\n' "${!cuda_dirs[@]}" | sort | paste -sd:)"
    # Outside lib/gcc-fallback (libstdc++ needs more: see the header).
    echo "glibc_required=$(newest_glibc_version_needed "${lib_files[@]}")"
  } >"$stage/BUNDLE-INFO"

  mkdir -p "$out_dir"
  local archive=$out_dir/$archive_name
  local partial=$archive.partial
  # Sorted names, fixed owner and the commit's time: the listing and the files' metadata do not
  # change from one packing to the next (BUNDLE-INFO's packed_at does).
  local mtime
  mtime=$(git -C "$root" log -1 --format=%ct 2>/dev/null || echo 0)
  tar -C "$stage" --sort=name --owner=0 --group=0 --numeric-owner --mtime="@$mtime" -cf - . |
    xz -6 -T0 >"$partial"
  mv -f "$partial" "$archive"

  local bytes
  bytes=$(stat -c %s "$archive")
  log "archive: $archive"
  log "size: $bytes bytes ($(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }') MiB," \
    "limit $max_archive_mib MiB); ${#bundled[@]} libraries; CUDA libraries the GPU machine" \
    "must provide: ${!cuda_needed[*]}"
  if ((bytes >= max_archive_mib * 1024 * 1024)); then
    die "the archive is $bytes bytes, over the $max_archive_mib MiB limit"
  fi
  check_archive "$archive"
}

main() {
  local build_dir=$root/build out_dir=$root/gpu-bundle check="" positional=()
  while [[ $# -gt 0 ]]; do
    case $1 in
      --out) out_dir=${2:?--out needs a folder}; shift 2 ;;
      --out=*) out_dir=${1#--out=}; shift ;;
      --check) check=${2:?--check needs an archive}; shift 2 ;;
      --check=*) check=${1#--check=}; shift ;;
      -h | --help) usage; exit 0 ;;
      -*) usage >&2; die "unknown option $1" ;;
      *) positional+=("$1"); shift ;;
    esac
  done
  if [[ -n $check ]]; then
    check_archive "$check"
    return
  fi
  [[ ${#positional[@]} -le 1 ]] || die "one BUILD_DIR at most"
  [[ ${#positional[@]} -eq 1 ]] && build_dir=$(cd "${positional[0]}" && pwd)
  pack "$build_dir" "$out_dir"
}

main "$@"
