#!/usr/bin/env bash
# scripts/gpu-bundle.sh packs an archive for a GPU machine that has none of our Debian libraries:
#   1. packing the build succeeds, the archive is under 64 MiB (what the device tool carries,
#      tree included) and the script's loader check reports that it passed;
#   2. the archive holds what gpu-check.sh uses (lockstep, lockstep-worker, the data, the
#      manifest, the PyTorch peer) and every bundled program's RUNPATH or LD_LIBRARY_PATH setup;
#   3. the loader check fails, naming the library, when a library is taken out of the archive
#      (so that 1 means something) and when a program needs a library found outside it.
#
#   gpu_bundle_test.sh --source DIR --build DIR
# Exit status: 0 pass, 1 fail, 77 skip (the build has no lockstep-worker).
set -euo pipefail

source_dir="" build_dir=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --source) source_dir=$2; shift 2 ;;
    --build) build_dir=$2; shift 2 ;;
    *) echo "usage: $0 --source DIR --build DIR" >&2; exit 2 ;;
  esac
done
[[ -n $source_dir && -n $build_dir ]] || { echo "usage: $0 --source DIR --build DIR" >&2; exit 2; }

if [[ ! -x $build_dir/bin/lockstep-worker || ! -x $build_dir/bin/lockstep ]]; then
  echo "SKIP: $build_dir/bin has no lockstep-worker or lockstep"
  exit 77
fi

work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_bundle_test.XXXXXX")
trap 'rm -rf "$work"' EXIT
failures=0
fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

bundle_script=$source_dir/scripts/gpu-bundle.sh
archive=$work/out/lockstep-gpu-bundle.tar.xz

# 1. Pack into a folder of our own (never the checkout's gpu-bundle/).
if ! "$bundle_script" --out "$work/out" "$build_dir" >"$work/pack.log" 2>&1; then
  cat "$work/pack.log" >&2
  echo "FAIL: gpu-bundle.sh exited non-zero" >&2
  exit 1
fi
cat "$work/pack.log"
[[ -f $archive ]] || { echo "FAIL: no archive at $archive" >&2; exit 1; }
bytes=$(stat -c %s "$archive")
((bytes < 64 * 1024 * 1024)) || fail "the archive is $bytes bytes, not under 64 MiB"
grep -q '^gpu-bundle: loader check passed' "$work/pack.log" ||
  fail "gpu-bundle.sh did not report that its loader check passed"

# 2. What gpu-check.sh relies on is in the archive.
mkdir "$work/unpacked"
tar -C "$work/unpacked" -xJf "$archive"
for path in bin/lockstep bin/lockstep-worker BUNDLE-INFO examples/fashion-mnist.yaml \
  bench/train_step/torch_step.py examples/pytorch/train_ddp.py tests/python/test_elastic.py \
  bench/exec_goodput/run.py bench/benchlib.py lib/lockstep/python/lockstep/elastic.py \
  data/fashion-mnist/train-images-idx3-ubyte.gz \
  data/fashion-mnist/train-labels-idx1-ubyte.gz data/fashion-mnist/t10k-images-idx3-ubyte.gz \
  data/fashion-mnist/t10k-labels-idx1-ubyte.gz lib/gcc-fallback/libstdc++.so.6; do
  [[ -e $work/unpacked/$path ]] || fail "the archive has no $path"
done
for program in cuda_kernels_test comm_nccl_communicator_test kernels_test kernels_cuda_bench \
  trainer_device_test train_step_bench in_place_recovery_test; do
  if [[ -x $build_dir/bin/$program && ! -x $work/unpacked/bin/$program ]]; then
    fail "$program is built but not in the archive"
  fi
done

# lockstep and lockstep-worker open cuBLAS with dlopen (kernels/cuda/cublas_library.h), so no
# loader check sees them need it: the list of what the GPU machine must provide still names it
# (gpu-check.sh finds and sets up exactly those libraries).
if [[ -x $build_dir/bin/cuda_kernels_test ]] &&
  ! grep -q '^cuda_libraries=.*libcublas\.so\.' "$work/unpacked/BUNDLE-INFO"; then
  fail "BUNDLE-INFO's cuda_libraries does not name libcublas.so, which the CUDA device opens"
fi

# Repacks the unpacked tree as archive $1, without the data (the check does not read it) and with
# the fastest xz level: seconds instead of the minute a real packing takes.
repack() {
  tar -C "$work/unpacked" --exclude=./data -cf - . | xz -0 -T0 >"$1"
}

# expect_check_refuses ARCHIVE LOG MESSAGE WHY: the check of ARCHIVE must fail, and its output
# must contain MESSAGE (a grep pattern); WHY says what was broken.
expect_check_refuses() {
  local archive=$1 log=$2 message=$3 why=$4
  if "$bundle_script" --check "$archive" >"$log" 2>&1; then
    fail "the check passed although $why"
  elif ! grep -q "$message" "$log"; then
    cat "$log" >&2
    fail "the check failed without saying \"$message\" ($why)"
  fi
}

# 3a. A library taken out: the check must fail and name it.
victim=libyaml-cpp.so.0.7
if [[ -f $work/unpacked/lib/$victim ]]; then
  rm "$work/unpacked/lib/$victim"
  repack "$work/without-library.tar.xz"
  expect_check_refuses "$work/without-library.tar.xz" "$work/check-missing.log" \
    "$victim resolves outside the bundle" "$victim was taken out of the archive"
else
  fail "the archive has no lib/$victim (lockstep links yaml-cpp)"
fi

# 3b. A library the loader cannot find anywhere: a program that needs one more library, which
# no folder holds. The archive is rebuilt from the unpacked tree with that program added.
if command -v patchelf >/dev/null; then
  rm -rf "$work/unpacked" && mkdir "$work/unpacked"
  tar -C "$work/unpacked" -xJf "$archive"
  cp "$work/unpacked/bin/lockstep" "$work/unpacked/bin/lockstep-needs-more"
  patchelf --add-needed libdoes-not-exist.so.1 "$work/unpacked/bin/lockstep-needs-more"
  repack "$work/unresolvable.tar.xz"
  expect_check_refuses "$work/unresolvable.tar.xz" "$work/check-unresolvable.log" \
    "libdoes-not-exist.so.1 not found" "a program needs libdoes-not-exist.so.1"
else
  echo "note: no patchelf: the unresolvable-library case is not exercised"
fi

if ((failures > 0)); then
  echo "$failures failure(s)" >&2
  exit 1
fi
echo "PASS: archive $bytes bytes; the loader check passes on it and fails on damaged copies"
