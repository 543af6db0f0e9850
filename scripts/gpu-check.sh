#!/usr/bin/env bash
# Lockstep's checks on a GPU machine, in one command and under 10 minutes (issues 17 and 18).
#
#   scripts/gpu-check.sh                    from the repository root, with the archive of
#                                           scripts/gpu-bundle.sh in gpu-bundle/
#   scripts/gpu-check.sh --bundle ARCHIVE   another archive
#   scripts/gpu-check.sh --cpu-selftest     on a machine without a GPU: only steps b and c, with
#                                           device cpu, to check this script and the bundle
#
# With the device tool: run(command="scripts/gpu-check.sh", carry=["gpu-bundle"]).
#
# The GPU machine has an NVIDIA driver, CUDA 13 libraries (in PyTorch's pip packages, maybe a
# toolkit in /usr/local/cuda) and PyTorch, but none of our Debian libraries: those come in the
# archive, which is unpacked into /tmp/lockstep-gpu (left there for inspection; the next run
# replaces it); CUDA, cuBLAS and NCCL are that machine's own (they must match its driver).
# Steps, each under its own time limit and all within LOCKSTEP_GPU_CHECK_BUDGET_S (default 540 s;
# a step that would not fit is skipped, saying so):
#   a. the gtest programs: cuda_kernels_test, comm_nccl_communicator_test, trainer_device_test
#      (label gpu) and kernels_test (the CPU kernels, for comparison); a GPU test skipped "no
#      CUDA device" / "no GPU" counts as a failure here, since there is one
#   b. `lockstep run` of examples/fashion-mnist.yaml with one worker, on cpu and on cuda: final
#      loss, accuracy, samples/s and wall time side by side; cuda's accuracy must be within 0.5
#      points of cpu's
#   c. the kill test: the cuda run with checkpoints and restartPolicy OnFailure; once a checkpoint
#      is committed its worker is SIGKILLed, and the replacement must resume from a checkpoint
#      and finish at the manifest's step count
#   e. kernels_cuda_bench: each kernel's bandwidth against a device-to-device copy
#   f. train_step_bench (Lockstep) against bench/train_step/torch_step.py (PyTorch eager and
#      torch.compile): step time of the 784-256-10 MLP at batch 64 and 4096-4096-4096-10 at 512
#   d. compute-sanitizer, last because it is the slowest and least predictable step: memcheck and
#      racecheck over cuda_kernels_test, memcheck over a 50-step cuda `lockstep run`
#
# Output: each step's log under $OUT/logs when the device tool sets OUT (kept in
# /tmp/lockstep-gpu/logs and packed into $OUT/logs.tar.gz after every step, so that $OUT holds
# two files: summary.txt and logs.tar.gz), else under build/gpu-check/. The summary (machine,
# step table, figures) is printed last: the device tool returns only the end of the output.
#
# Exit status: 0 every step passed or was skipped; 1 a step failed; 2 refused (no GPU here, no
# archive, bad arguments).
set -uo pipefail  # not -e: a failing step is recorded and the next one runs

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
readonly root
readonly work=/tmp/lockstep-gpu                  # the archive's manifests name this folder
readonly budget_s=${LOCKSTEP_GPU_CHECK_BUDGET_S:-540}
readonly reserve_s=15                            # kept for the summary and the log archive
readonly kill_test_seconds=25                    # how long the kill test's run should train
readonly kill_test_max_steps=20000
readonly sanitizer_steps=50
readonly started_s=$SECONDS
# The libraries the programs need from the machine (the archive's BUNDLE-INFO adds its own).
cuda_library_names=(libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2)

bundle=$root/gpu-bundle/lockstep-gpu-bundle.tar.xz
selftest=false
while [[ $# -gt 0 ]]; do
  case $1 in
    --bundle) bundle=${2:?--bundle needs an archive}; shift 2 ;;
    --cpu-selftest) selftest=true; shift ;;
    -h | --help) sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu-check: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [[ -n ${OUT:-} ]]; then
  result_dir=$OUT
  log_dir=$work/logs
else
  result_dir=$root/build/gpu-check
  log_dir=$result_dir/logs
fi

say() { echo "gpu-check: $*"; }
refuse() {
  echo "gpu-check: refused: $*" >&2
  exit 2
}

# ---------------------------------------------------------------------------------------------
# Is there a GPU? Refuse before touching anything when there is not.

gpu_missing_reason() {  # prints why this machine cannot run the GPU steps; nothing when it can
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    echo "nvidia-smi is not on PATH (no NVIDIA driver installed)"
    return
  fi
  if ! compgen -G '/dev/nvidia[0-9]*' >/dev/null; then
    echo "no /dev/nvidia<N> device node (no GPU visible to this machine or container)"
    return
  fi
  local listing
  if ! listing=$(nvidia-smi -L 2>&1) || ! grep -q '^GPU [0-9]' <<<"$listing"; then
    echo "nvidia-smi -L lists no GPU: $(head -c 300 <<<"$listing")"
    return
  fi
  # PyTorch's view, when it is installed (it is the peer of step f; without it, f is skipped).
  local torch_says
  torch_says=$(python3 -c 'import torch; print(torch.cuda.is_available())' 2>/dev/null) || return 0
  if [[ $torch_says != True ]]; then
    echo "torch.cuda.is_available() is false although nvidia-smi lists a GPU" \
      "(driver/CUDA mismatch?)"
  fi
}

if ! $selftest; then
  reason=$(gpu_missing_reason)
  [[ -z $reason ]] || refuse "no usable GPU on this machine: $reason. Run it on a GPU machine" \
    "(or use --cpu-selftest to check the CPU steps of this script)."
fi
[[ -f $bundle ]] || refuse "no archive at $bundle: run scripts/gpu-bundle.sh on the build" \
  "machine and carry gpu-bundle/ along (device tool: carry=[\"gpu-bundle\"])."

# ---------------------------------------------------------------------------------------------
# Results: one row per step, and report sections (files) that the summary puts after the table.

step_names=()
step_states=()
step_details=()
step_seconds=()
failures=0
machine_lines=()

remaining_s() { echo $((budget_s - (SECONDS - started_s))); }

# Prints the time limit for a step that wants $1 seconds: what is left of the budget (minus the
# reserve) when that is less. Fails when less than $2 (default 10) seconds would be left.
step_limit() {
  local want=$1 minimum=${2:-10} left
  left=$(($(remaining_s) - reserve_s))
  ((left >= minimum)) || return 1
  echo $((want < left ? want : left))
}

# record NAME PASS|FAIL|SKIP DETAIL...: a row of the table (the DETAIL words joined by spaces).
# Its seconds are those since the previous row: the steps run one after the other, each ending in
# its row.
row_started_s=$SECONDS
record() {
  local detail="${*:3}"
  step_names+=("$1")
  step_states+=("$2")
  step_details+=("$detail")
  step_seconds+=("$((SECONDS - row_started_s))")
  row_started_s=$SECONDS
  [[ $2 == FAIL ]] && failures=$((failures + 1))
  say "[$2] $1: $detail"
  publish
}

section_file() { echo "$log_dir/report-$1.txt"; }  # a report section, put in the summary

render_summary() {
  local i
  echo "=============== Lockstep GPU check ($(date -u +%Y-%m-%dT%H:%M:%SZ)) ==============="
  printf '%s\n' "${machine_lines[@]}"
  echo
  printf '%-44s %-5s %6s  %s\n' "step" "state" "secs" "detail"
  for i in "${!step_names[@]}"; do
    printf '%-44s %-5s %6s  %s\n' "${step_names[$i]}" "${step_states[$i]}" "${step_seconds[$i]}" \
      "${step_details[$i]}"
  done
  local section
  for section in "$log_dir"/report-*.txt; do
    [[ -f $section ]] || continue
    echo
    cat "$section"
  done
  echo
  echo "total $((SECONDS - started_s)) s of a $budget_s s budget; $failures step(s) failed;" \
    "logs: $([[ -n ${OUT:-} ]] && echo "\$OUT/logs.tar.gz" || echo "$log_dir")"
}

# Writes the summary and, under the device tool, the log archive: after every step, so that a run
# cut short by the tool's limit still brings back what it did.
publish() {
  mkdir -p "$result_dir"
  render_summary >"$result_dir/summary.txt.partial" && mv -f "$result_dir/summary.txt.partial" \
    "$result_dir/summary.txt"
  if [[ -n ${OUT:-} && -d $log_dir ]]; then
    cap_large_logs
    tar -C "$(dirname "$log_dir")" -czf "$result_dir/logs.tar.gz.partial" "$(basename "$log_dir")" \
      2>/dev/null && mv -f "$result_dir/logs.tar.gz.partial" "$result_dir/logs.tar.gz"
  fi
}

# The tool brings back files of at most 16 MiB: a log over 4 MiB keeps its first and last 2 MiB.
cap_large_logs() {
  local file
  while IFS= read -r file; do
    { head -c 2097152 "$file"; printf '\n[... gpu-check: cut to its first and last 2 MiB ...]\n'
      tail -c 2097152 "$file"; } >"$file.cut" && mv -f "$file.cut" "$file"
  done < <(find "$log_dir" -type f -size +4M 2>/dev/null)
}

# run_logged LIMIT LOG COMMAND...: runs COMMAND under `timeout` (its whole process group), output
# to LOG after a line naming the command. Returns its status: 124 when it ran out of time.
run_logged() {
  local limit=$1 log=$2
  shift 2
  printf '$ %s\n# time limit %s s; LD_LIBRARY_PATH=%s\n' "$*" "$limit" "${LD_LIBRARY_PATH:-}" \
    >"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
}

# The kill test's `lockstep run` runs in the background: stop it (it stops its workers) if this
# script is ended first.
background_pid=""
trap '[[ -n $background_pid ]] && kill -TERM "$background_pid" 2>/dev/null' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# ---------------------------------------------------------------------------------------------
# Unpack, and find this machine's CUDA libraries.

rm -rf "$work"
mkdir -p "$work"
if command -v xz >/dev/null 2>&1; then
  tar -C "$work" -xJf "$bundle" || refuse "cannot unpack $bundle"
else  # Python's tarfile reads xz (lzma) where the xz tool is missing
  python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
    "$bundle" "$work" || refuse "cannot unpack $bundle (no xz, and Python failed)"
fi
rm -rf "$log_dir"
mkdir -p "$log_dir"
[[ -n ${OUT:-} ]] && rm -f "$result_dir/summary.txt" "$result_dir/logs.tar.gz"
bin=$work/bin
bundle_commit=$(sed -n 's/^commit=//p' "$work/BUNDLE-INFO")
read -r -a bundle_cuda_names <<<"$(sed -n 's/^cuda_libraries=//p' "$work/BUNDLE-INFO")"
for name in "${bundle_cuda_names[@]}"; do
  [[ " ${cuda_library_names[*]} " == *" $name "* ]] || cuda_library_names+=("$name")
done

# Where each CUDA library is, in this order: PyTorch's pip packages (the set torch itself runs
# with on this machine's driver: nvidia/<package>/lib, e.g. nvidia/cu13/lib, nvidia/nccl/lib),
# then a CUDA toolkit, then the loader's cache. Prints "name path" lines ("name -" when absent).
find_cuda_libraries() {
  local -a roots=() dirs=(/usr/local/cuda/lib64 /usr/local/cuda/lib
    /usr/local/cuda/targets/x86_64-linux/lib)
  mapfile -t roots < <(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  local name found package_root dir
  for name in "${cuda_library_names[@]}"; do
    found=""
    for package_root in "${roots[@]}"; do
      [[ -d $package_root ]] || continue
      found=$(find "$package_root" -maxdepth 3 -name "$name" 2>/dev/null | sort | head -n 1)
      [[ -n $found ]] && break
    done
    if [[ -z $found ]]; then
      for dir in "${dirs[@]}"; do
        [[ -e $dir/$name ]] && { found=$dir/$name; break; }
      done
    fi
    if [[ -z $found ]]; then
      found=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n && /x86-64/ { print $NF; exit }')
    fi
    echo "$name ${found:--}"
  done
}

library_path=$work/lib
missing_cuda=()
cuda_choice_lines=()
while read -r name path; do
  if [[ $path == - ]]; then
    missing_cuda+=("$name")
    cuda_choice_lines+=("  $name: NOT FOUND")
    continue
  fi
  cuda_choice_lines+=("  $name: $path")
  dir=$(dirname "$path")
  [[ ":$library_path:" == *":$dir:"* ]] || library_path+=:$dir
done < <(find_cuda_libraries)

# The GCC runtime: this machine's own unless the loader says it is too old for our programs
# (gpu-bundle.sh explains why ours is only a fallback). The same trace names any other library or
# symbol the programs cannot find here, before any step fails on it.
readonly loader=/lib64/ld-linux-x86-64.so.2
loader_problems() {  # LD_LIBRARY_PATH value; prints "program: problem" lines
  local program
  [[ -x $loader ]] || return 0
  for program in "$bin"/*; do
    env LD_TRACE_LOADED_OBJECTS=1 LD_WARN=yes LD_BIND_NOW=yes LD_LIBRARY_PATH="$1" \
      "$loader" "$program" 2>&1 | grep -E 'not found|undefined symbol' |
      sed "s|^[[:space:]]*|$(basename "$program"): |"
  done
}
gcc_runtime="this machine's"
problems=$(loader_problems "$library_path")
if [[ -n $problems ]]; then
  fallback_problems=$(loader_problems "$library_path:$work/lib/gcc-fallback")
  if [[ -z $fallback_problems || $(wc -l <<<"$fallback_problems") -lt $(wc -l <<<"$problems") ]]
  then
    library_path+=:$work/lib/gcc-fallback
    gcc_runtime="the bundle's (this machine's is missing or too old)"
    problems=$fallback_problems
  fi
fi
export LD_LIBRARY_PATH=$library_path

# ---------------------------------------------------------------------------------------------
# What the summary says about the machine.

machine_lines+=("bundle: $bundle (commit $bundle_commit)")
if ! $selftest; then
  machine_lines+=("gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap \
    --format=csv,noheader 2>&1 | head -n 4 | paste -sd ';')")
  machine_lines+=("driver: $(nvidia-smi 2>/dev/null |
    grep -oE 'Driver Version: [0-9.]+ +CUDA Version: [0-9.]+' | head -n 1)")
else
  machine_lines+=("mode: --cpu-selftest (no GPU steps; device cpu for b and c)")
fi
glibc_here=$(getconf GNU_LIBC_VERSION 2>/dev/null | awk '{ print $2 }')
glibc_needed=$(sed -n 's/^glibc_required=//p' "$work/BUNDLE-INFO")
python_here=$(python3 -c 'import sys; print(sys.version.split()[0])' 2>/dev/null || echo absent)
torch_here=$(python3 -c 'import torch; print(torch.__version__)' 2>/dev/null || echo absent)
host_line="host: $(uname -r), $(nproc) cores, glibc ${glibc_here:-?} (the bundle needs"
host_line+=" ${glibc_needed:-?}); python3 $python_here; torch $torch_here"
machine_lines+=("$host_line")
driver_library=$(ldconfig -p 2>/dev/null |
  awk '$1 == "libcuda.so.1" && /x86-64/ { print $NF; exit }')
machine_lines+=("CUDA libraries:" "${cuda_choice_lines[@]}")
machine_lines+=("  libcuda.so.1 (driver): ${driver_library:-not in the loader cache}")
machine_lines+=("GCC runtime: $gcc_runtime")
machine_lines+=("LD_LIBRARY_PATH=$LD_LIBRARY_PATH")
printf '%s\n' "${machine_lines[@]}" | tee "$log_dir/machine.txt"
{
  echo "--- BUNDLE-INFO"; cat "$work/BUNDLE-INFO"
  if ! $selftest; then echo "--- nvidia-smi"; nvidia-smi 2>&1; fi
} >>"$log_dir/machine.txt"

# And a program actually started from the unpacked folder (a /tmp mounted noexec would stop
# everything here, with this message).
if ! started=$("$bin/lockstep" version 2>&1); then
  record "loader: bin/lockstep starts" FAIL "$(head -c 300 <<<"$started")"
fi
if [[ -n $problems ]]; then
  record "loader: every program's libraries" FAIL \
    "$(wc -l <<<"$problems") unresolved: $(head -n 3 <<<"$problems" | paste -sd ';')"
  echo "$problems" >"$log_dir/loader-problems.txt"
elif ((${#missing_cuda[@]} > 0)) && ! $selftest; then
  record "loader: every program's libraries" FAIL "not found on this machine: ${missing_cuda[*]}"
else
  record "loader: every program's libraries" PASS "all resolve (bundle, CUDA, glibc)"
fi

# ---------------------------------------------------------------------------------------------
# a. gtest programs.

# gtest_verdict XML GPU_PROGRAM(true|false): prints "P passed, F failed, S skipped (reasons)";
# exits 1 when a test failed, 3 when a GPU program skipped a test for lack of a GPU.
gtest_verdict() {
  python3 - "$1" "$2" <<'PY'
import collections, re, sys
import xml.etree.ElementTree as ET
path, gpu_program = sys.argv[1], sys.argv[2] == "true"
try:
    cases = list(ET.parse(path).getroot().iter("testcase"))
except (OSError, ET.ParseError) as error:
    print(f"no test report ({error.__class__.__name__}): crashed or ran out of time?")
    sys.exit(1)
failed = [c for c in cases if c.find("failure") is not None]
skipped = [c for c in cases if c.get("result") == "skipped" or c.find("skipped") is not None]
def skip_reason(case):  # gtest's message is "file:line" then the reason
    element = case.find("skipped")
    lines = (element.get("message", "") if element is not None else "").strip().splitlines()
    return lines[-1][:80] if lines else ""
reasons = collections.Counter(skip_reason(c) for c in skipped)
passed = len(cases) - len(failed) - len(skipped)
text = f"{passed} passed, {len(failed)} failed, {len(skipped)} skipped"
if reasons:
    text += " (" + "; ".join(f"{n}x {r or '?'}" for r, n in reasons.most_common(3)) + ")"
if failed:
    text += "; failed: " + ", ".join(f"{c.get('classname')}.{c.get('name')}" for c in failed[:4])
print(text)
no_gpu = re.compile(r"no (cuda|gpu)|no .*device|without a gpu", re.I)
if failed:
    sys.exit(1)
if gpu_program and any(no_gpu.search(r) for r in reasons):
    sys.exit(3)
PY
}

# gtest_step PROGRAM GPU_PROGRAM WANT_SECONDS [gtest flags...]
gtest_step() {
  local program=$1 gpu_program=$2 want=$3
  shift 3
  local name="a. $program"
  if [[ ! -x $bin/$program ]]; then
    record "$name" SKIP "not in the bundle (not built)"
    return
  fi
  local limit
  limit=$(step_limit "$want") || { record "$name" SKIP "no time left in the budget"; return; }
  local status verdict verdict_status
  run_logged "$limit" "$log_dir/$program.log" "$bin/$program" --gtest_brief=1 \
    --gtest_output="xml:$log_dir/$program.xml" "$@"
  status=$?
  verdict=$(gtest_verdict "$log_dir/$program.xml" "$gpu_program")
  verdict_status=$?
  if ((status == 124)); then
    record "$name" FAIL "ran out of its $limit s: $verdict"
  elif ((status != 0 || verdict_status == 1)); then
    [[ -f $log_dir/$program.xml ]] || verdict+="; last line: $(tail -n 1 "$log_dir/$program.log")"
    record "$name" FAIL "exit $status: $verdict"
  elif ((verdict_status == 3)); then
    record "$name" FAIL "GPU tests skipped although this machine has a GPU: $verdict"
  else
    record "$name" PASS "$verdict"
  fi
}

# ---------------------------------------------------------------------------------------------
# b and c: training runs of the Fashion-MNIST manifest, rewritten for the bundle.

# make_manifest OUT DEVICE STEPS [checkpoint]: the archive's examples/fashion-mnist.yaml with the
# bundle's data, one replica, DEVICE and STEPS ("-": the example's own), the metrics endpoint on a
# free port (the example's 9400 is also dcgm-exporter's), and with "checkpoint": checkpoints every
# 200 steps under /tmp/lockstep-gpu/ckpt and restartPolicy OnFailure, backoffLimit 3. Every
# rewrite must match exactly once, or the example changed under us and this says so.
make_manifest() {
  python3 - "$work/examples/fashion-mnist.yaml" "$@" "$work" <<'PY'
import re, socket, sys
source, out, device, steps, *rest = sys.argv[1:]
work = rest[-1]
checkpoint = "checkpoint" in rest[:-1]
text = open(source).read()

def rewrite(pattern, replacement, count=1):
    global text
    text, n = re.subn(pattern, replacement, text, flags=re.M)
    if n != count:
        sys.exit(f"make_manifest: {pattern!r} matched {n} times in {source}, expected {count}")

rewrite(r"file:///usr/share/datasets/fashion-mnist/", f"file://{work}/data/fashion-mnist/", count=4)
rewrite(r"^(\s+)replicas:\s*\d+.*$", r"\g<1>replicas: 1")
rewrite(r"^(\s+)device:\s*\w+.*$", rf"\g<1>device: {device}")
if steps != "-":
    rewrite(r"^(\s+)steps:\s*\d+.*$", rf"\g<1>steps: {steps}")
with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
rewrite(r"^(\s+)metrics:.*$", rf"\g<1>metrics: {{port: {port}}}")
if checkpoint:
    rewrite(r"^(\s+)restartPolicy:\s*\w+.*$",
            r"\g<1>restartPolicy: OnFailure\n\g<1>backoffLimit: 3")
    text = text.rstrip("\n") + (f"\n  checkpoint: {{uri: file://{work}/ckpt, intervalSteps: 200, "
                                "keep: 3, async: true}\n")
open(out, "w").write(text)
PY
}

# failure_reason DIR: the line that says best why the run in DIR failed: a worker's or the
# manifest's error, else lockstep's own report of the failure, else its last line.
failure_reason() {
  local dir=$1 line
  line=$(cat "$dir"/make-manifest.log "$dir"/validate.log "$dir"/run/worker-*.log 2>/dev/null |
    grep -m 1 -E 'error|Error|FATAL|Check failed|not found')
  [[ -z $line ]] &&
    line=$(grep -m 1 -E '^lockstep: .*(failed|error)' "$dir/lockstep-run.log" 2>/dev/null)
  [[ -z $line ]] && line=$(tail -n 1 "$dir/lockstep-run.log" 2>/dev/null)
  echo "${line:0:300}"
}

# summary_field JSON FIELD: prints the field of a `lockstep run --summary` file ("?" if absent).
summary_field() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1])).get(sys.argv[2], "?"))' \
    "$1" "$2" 2>/dev/null || echo "?"
}

# train_run DEVICE DIR STEPS WANT_SECONDS [checkpoint]: writes DIR/manifest.yaml, validates it,
# runs it in the foreground. Returns lockstep's status (124: out of time; 97: no time left).
train_run() {
  local device=$1 dir=$2 steps=$3 want=$4
  shift 4
  mkdir -p "$dir"
  make_manifest "$dir/manifest.yaml" "$device" "$steps" "$@" >"$dir/make-manifest.log" 2>&1 ||
    return 2
  "$bin/lockstep" validate "$dir/manifest.yaml" >"$dir/validate.log" 2>&1 || return 2
  local limit
  limit=$(step_limit "$want") || return 97
  run_logged "$limit" "$dir/lockstep-run.log" "$bin/lockstep" run "$dir/manifest.yaml" \
    --replicas 1 --summary "$dir/summary.json" --log-dir "$dir/run"
}

train_step() {  # b.
  local devices=(cpu cuda)
  $selftest && devices=(cpu)
  local device status
  for device in "${devices[@]}"; do
    train_run "$device" "$log_dir/train-$device" - 240
    status=$?
    case $status in
      0) record "b. lockstep run, device $device" PASS \
        "accuracy $(summary_field "$log_dir/train-$device/summary.json" eval_accuracy)" ;;
      97) record "b. lockstep run, device $device" SKIP "no time left in the budget" ;;
      *) record "b. lockstep run, device $device" FAIL "exit $status: $(failure_reason \
        "$log_dir/train-$device")" ;;
    esac
  done
  # Side by side; the verdict needs both (the self-test has only cpu).
  local verdict
  verdict=$(python3 - "$log_dir/train-cpu/summary.json" "$log_dir/train-cuda/summary.json" \
    "$(section_file b-training)" <<'PY'
import json, sys
cpu_path, cuda_path, section = sys.argv[1:]
def load(path):
    try:
        return json.load(open(path))
    except (OSError, ValueError):
        return {}
runs = {"cpu": load(cpu_path), "cuda": load(cuda_path)}
rows = [("status", "status", "{}"), ("steps", "steps", "{}"),
        ("final loss", "final_loss", "{:.4f}"), ("test accuracy", "eval_accuracy", "{:.4f}"),
        ("samples/s", "samples_per_second", "{:.0f}"), ("wall s", "wall_seconds", "{:.1f}")]
lines = ["b. Fashion-MNIST, examples/fashion-mnist.yaml, 1 worker, batch 64:",
         f"  {'':16}{'cpu':>12}{'cuda':>12}"]
for label, key, form in rows:
    cells = []
    for device in ("cpu", "cuda"):
        value = runs[device].get(key)
        cells.append("-" if value is None else form.format(value))
    lines.append(f"  {label:16}{cells[0]:>12}{cells[1]:>12}")
open(section, "w").write("\n".join(lines) + "\n")
cpu_acc, cuda_acc = runs["cpu"].get("eval_accuracy"), runs["cuda"].get("eval_accuracy")
if any(runs[d].get("status") != "succeeded" for d in runs):
    print("SKIP needs both runs to have succeeded")
elif cuda_acc < cpu_acc - 0.005:
    print(f"FAIL cuda accuracy {cuda_acc:.4f} is more than 0.5 points below cpu's {cpu_acc:.4f}")
else:
    print(f"PASS cuda accuracy {cuda_acc:.4f} vs cpu {cpu_acc:.4f} (within 0.5 points)")
PY
  )
  record "b. cuda accuracy within 0.5 points of cpu" "${verdict%% *}" "${verdict#* }"
}

# The pid of the lockstep-worker that `lockstep run` started with manifest DIR/run/manifest.json
# (from /proc: procps may be absent on the GPU machine).
worker_pid() {
  local manifest=$1 proc cmdline
  for proc in /proc/[0-9]*; do
    cmdline=$(tr '\0' ' ' <"$proc/cmdline" 2>/dev/null) || continue
    if [[ $cmdline == *"lockstep-worker train --manifest $manifest "* ]]; then
      basename "$proc"
      return 0
    fi
  done
  return 1
}

# The kill test's step count: about kill_test_seconds of training at the rate step b measured
# on DEVICE (so that the kill lands mid-run however fast or slow the device is, and the test
# stays short), in whole checkpoint intervals, between 1000 and kill_test_max_steps.
kill_test_steps_for() {
  python3 - "$log_dir/train-$1/summary.json" "$kill_test_seconds" "$kill_test_max_steps" <<'PY'
import json, sys
path, seconds, most = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
try:  # steps per second of the whole run, start-up and evaluation included: on the safe side
    summary = json.load(open(path))
    rate = float(summary["steps"]) / float(summary["wall_seconds"])
except (OSError, ValueError, KeyError, ZeroDivisionError):
    rate = 0
steps = int(rate * seconds) // 200 * 200 if rate > 0 else most
print(min(most, max(1000, steps)))
PY
}

kill_step() {  # c.
  local device=cuda
  $selftest && device=cpu
  local name="c. kill test, device $device" dir=$log_dir/kill-$device
  local kill_test_steps
  kill_test_steps=$(kill_test_steps_for "$device")
  local limit
  limit=$(step_limit 180 60) || { record "$name" SKIP "no time left in the budget"; return; }
  rm -rf "$work/ckpt"
  mkdir -p "$dir"
  if ! make_manifest "$dir/manifest.yaml" "$device" "$kill_test_steps" checkpoint \
    >"$dir/make-manifest.log" 2>&1 || ! "$bin/lockstep" validate "$dir/manifest.yaml" \
    >"$dir/validate.log" 2>&1; then
    record "$name" FAIL "manifest: $(failure_reason "$dir")"
    return
  fi
  local deadline=$((SECONDS + limit))
  "$bin/lockstep" run "$dir/manifest.yaml" --replicas 1 --summary "$dir/summary.json" \
    --log-dir "$dir/run" >"$dir/lockstep-run.log" 2>&1 &
  local run_pid=$!
  background_pid=$run_pid

  # A committed checkpoint is a step-<N> directory: it appears only by the final rename of the
  # commit (docs/checkpoints.md), so its presence means complete.
  local checkpoint="" killed="" note=""
  while ((SECONDS < deadline)) && kill -0 "$run_pid" 2>/dev/null; do
    checkpoint=$(find "$work/ckpt" -maxdepth 1 -name 'step-[0-9]*' 2>/dev/null | sort | head -n 1)
    if [[ -n $checkpoint ]]; then
      local pid
      if pid=$(worker_pid "$dir/run/manifest.json"); then
        kill -KILL "$pid" && killed=$pid
        echo "gpu-check: $(date -u +%H:%M:%S.%N | cut -c1-12) SIGKILL to lockstep-worker $pid" \
          "after $(basename "$checkpoint") appeared" >"$dir/kill.log"
      else
        note="no lockstep-worker process found for $dir/run/manifest.json"
      fi
      break
    fi
    sleep 0.05
  done
  # Let the run finish (the replacement trains the rest), bounded by the step's limit.
  while ((SECONDS < deadline)) && kill -0 "$run_pid" 2>/dev/null; do
    sleep 0.2
  done
  if kill -0 "$run_pid" 2>/dev/null; then
    kill -TERM "$run_pid"
    sleep 6
    kill -KILL "$run_pid" 2>/dev/null
    wait "$run_pid" 2>/dev/null
    background_pid=""
    record "$name" FAIL "ran out of its $limit s"
    return
  fi
  wait "$run_pid"
  local status=$?
  background_pid=""
  local steps resumed restarts
  steps=$(summary_field "$dir/summary.json" steps)
  resumed=$(summary_field "$dir/summary.json" resumed_from_step)
  restarts=$(summary_field "$dir/summary.json" restarts)
  local figures="steps $steps/$kill_test_steps, resumed_from_step $resumed, restarts $restarts,"
  figures+=" exit $status"
  {
    echo "c. kill test ($device, $kill_test_steps steps, checkpoints every 200):"
    if [[ -n $killed ]]; then
      echo "  killed worker $killed after $(basename "$checkpoint") was committed; $figures"
    else
      echo "  killed nothing (${note:-no checkpoint was committed while the run lasted}); $figures"
    fi
    echo "  checkpoints left: $(find "$work/ckpt" -maxdepth 1 -name 'step-*' -printf '%f\n' \
      2>/dev/null | sort | paste -sd ' ')"
  } >"$(section_file c-kill)"
  if [[ -z $killed ]]; then
    record "$name" FAIL "nothing killed:" \
      "${note:-the run ended before a checkpoint was committed}; $figures; $(failure_reason "$dir")"
  elif [[ $status == 0 && $steps == "$kill_test_steps" && $resumed =~ ^[0-9]+$ && $resumed -gt 0 &&
    $restarts =~ ^[0-9]+$ && $restarts -ge 1 ]]; then
    record "$name" PASS "$figures"
  else
    record "$name" FAIL \
      "$figures (want steps $kill_test_steps, resumed_from_step > 0, restarts >= 1, exit 0)"
  fi
}

# ---------------------------------------------------------------------------------------------
# e and f: benchmarks.

kernel_bench_step() {  # e.
  local name="e. kernels_cuda_bench"
  if [[ ! -x $bin/kernels_cuda_bench ]]; then
    record "$name" SKIP "not in the bundle (not built)"
    return
  fi
  local limit
  limit=$(step_limit 150) || { record "$name" SKIP "no time left in the budget"; return; }
  run_logged "$limit" "$log_dir/kernels_cuda_bench.log" "$bin/kernels_cuda_bench"
  local status=$?
  {
    echo "e. kernels_cuda_bench (goal: each kernel >= 85% of the device-to-device copy):"
    grep -v '^[$#]' "$log_dir/kernels_cuda_bench.log" | sed 's/^/  /'
  } >"$(section_file e-kernels)"
  if ((status != 0)); then
    record "$name" FAIL "exit $status (see its log)"
  elif grep -q 'no CUDA device' "$log_dir/kernels_cuda_bench.log"; then
    record "$name" FAIL "it saw no CUDA device"
  else
    record "$name" PASS "measured (table below)"
  fi
}

step_time_step() {  # f.
  local configs=("784,256,10:64" "4096,4096,4096,10:512") config limit status
  local log=$log_dir/train_step.txt
  : >"$log"
  if [[ -x $bin/train_step_bench ]]; then
    for config in "${configs[@]}"; do
      if ! limit=$(step_limit 60); then
        record "f. train_step_bench ${config}" SKIP "no time left in the budget"
        continue
      fi
      # Three runs (a lent machine's host and GPU vary from run to run: the table shows the
      # median and the spread), then one with a single gather thread, to show what the host's
      # share of a step is.
      local bench_log=$log_dir/train_step_bench-${config//[,:]/_}.log
      : >"$bench_log"
      local repeat failed=0
      for repeat in 1 2 3 single; do
        if [[ $repeat == single ]]; then
          run_logged "$limit" "$bench_log.$repeat" \
            env LOCKSTEP_GATHER_THREADS=1 "$bin/train_step_bench" --device cuda --layers "${config%%:*}" \
            --batch "${config##*:}" --steps 300 --warmup 50
          status=$?
          sed -E 's/^lockstep-cuda /lockstep-cuda-1thread /' "$bench_log.$repeat" >>"$bench_log"
        else
          run_logged "$limit" "$bench_log.$repeat" "$bin/train_step_bench" --device cuda \
            --layers "${config%%:*}" --batch "${config##*:}" --steps 300 --warmup 50
          status=$?
          cat "$bench_log.$repeat" >>"$bench_log"
        fi
        rm -f "$bench_log.$repeat"
        ((status == 0)) || failed=$status
      done
      grep -E '^lockstep-cuda' "$bench_log" >>"$log"
      if ((failed == 0)); then
        record "f. train_step_bench $config" PASS \
          "$(grep -E '^lockstep-cuda ' "$bench_log" | grep -oE 'step_ms=[0-9.]+' | tr '\n' ' ')"
      else
        record "f. train_step_bench $config" FAIL "exit $failed (see its log)"
      fi
    done
  else
    record "f. train_step_bench" SKIP "not in the bundle (not built)"
  fi
  if ! python3 -c 'import torch' 2>/dev/null; then
    record "f. torch_step.py" SKIP "no PyTorch for python3 here"
  elif ! limit=$(step_limit 240 30); then
    record "f. torch_step.py" SKIP "no time left in the budget"
  else
    run_logged "$limit" "$log_dir/torch_step.log" python3 "$work/bench/train_step/torch_step.py" \
      --steps 300 --warmup 50
    status=$?
    grep -E '^torch-' "$log_dir/torch_step.log" >>"$log"
    if ((status == 0)); then
      record "f. torch_step.py" PASS "$(grep -c 'step_ms=' "$log_dir/torch_step.log") figures;" \
        "$(grep -c 'error=' "$log_dir/torch_step.log") errors"
    else
      record "f. torch_step.py" FAIL "exit $status: $(tail -n 1 "$log_dir/torch_step.log")"
    fi
  fi
  python3 - "$log" "$(section_file f-step-time)" <<'PY'
import re, sys
log, section = sys.argv[1:]
import statistics
columns = ["lockstep-cuda", "lockstep-cuda-1thread", "torch-eager", "torch-compile"]
rows, gather = {}, {}
for line in open(log):
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    name = line.split()[0] if line.strip() else ""
    key = (fields.get("layers", "?"), fields.get("batch", "?"))
    if name in columns and "step_ms" in fields:
        rows.setdefault(key, {}).setdefault(name, []).append(float(fields["step_ms"]))
    elif name in columns and "error" in fields:
        rows.setdefault(key, {}).setdefault(name, [])
    if name == "lockstep-cuda" and "gather_ms_one_thread" in fields:
        gather.setdefault(key, []).append(float(fields["gather_ms_one_thread"]))
def cell(values):
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.4f}"
    return f"{statistics.median(values):.4f} ({min(values):.3f}-{max(values):.3f})"
lines = ["f. training step, ms (fp32, TF32 off; SGD momentum 0.9). torch: median of 300 per-step CUDA",
         "   events, inputs already on the GPU. lockstep: wall time over 300 steps of its real loop,",
         "   batches gathered on the host and copied each step; median (min-max) of 3 runs;",
         "   -1thread: one gather thread; gather: one host thread's gather of one batch.",
         f"  {'layers':18}{'batch':>6}" + "".join(f"{c:>26}" for c in columns) + f"{'gather':>22}"]
for (layers, batch), cells in rows.items():
    lines.append(f"  {layers:18}{batch:>6}" + "".join(f"{cell(cells.get(c, [])):>26}" for c in columns)
                 + f"{cell(gather.get((layers, batch), [])):>22}")
if not rows:
    lines.append("  (no figures)")
open(section, "w").write("\n".join(lines) + "\n")
PY
}

# ---------------------------------------------------------------------------------------------
# d. compute-sanitizer.

find_compute_sanitizer() {
  local candidate package_root
  for candidate in "$(command -v compute-sanitizer 2>/dev/null)" \
    /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
    [[ -n $candidate && -x $candidate ]] && { echo "$candidate"; return 0; }
  done
  while read -r package_root; do  # pip's nvidia-cuda-sanitizer-api, when installed
    [[ -d $package_root ]] || continue
    candidate=$(find "$package_root" -maxdepth 4 -type f -name compute-sanitizer -perm -u+x \
      2>/dev/null | head -n 1)
    [[ -n $candidate ]] && { echo "$candidate"; return 0; }
  done < <(python3 -c 'import nvidia; print("\n".join(nvidia.__path__))' 2>/dev/null)
  return 1
}

# sanitizer_verdict NAME STATUS LIMIT FILES...: records NAME from the "ERROR SUMMARY: N errors"
# lines in FILES (the tool's own output and, for `lockstep run`, the worker logs, where a child
# process's report may land).
sanitizer_verdict() {
  local name=$1 status=$2 limit=$3
  shift 3
  local summaries errors
  # memcheck's "ERROR SUMMARY: N errors"; racecheck's "RACECHECK SUMMARY: H hazards displayed
  # (N errors, W warnings)": N is the third number-bearing word either way after normalising.
  summaries=$(cat "$@" 2>/dev/null |
    grep -oE 'ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazards displayed \([0-9]+ error' |
    sed -E 's/RACECHECK SUMMARY: [0-9]+ hazards displayed \(([0-9]+) error/ERROR SUMMARY: \1 error/' ||
    true)
  errors=$(awk '{ sum += $3 } END { print sum + 0 }' <<<"$summaries")
  local count
  count=$(grep -c . <<<"$summaries")
  if ((status == 124)); then
    record "$name" FAIL \
      "ran out of its $limit s (narrow it with --gtest_filter); $errors errors so far"
  elif [[ -z $summaries ]]; then
    record "$name" FAIL "exit $status and no ERROR SUMMARY line (unsupported here? see its log)"
  elif ((errors > 0)); then
    record "$name" FAIL "ERROR SUMMARY: $errors errors ($count processes)"
  elif ((status != 0)); then
    record "$name" FAIL "ERROR SUMMARY: 0 errors, but exit $status"
  else
    record "$name" PASS "ERROR SUMMARY: 0 errors ($count processes)"
  fi
}

sanitizer_step() {  # d.
  local sanitizer
  if ! sanitizer=$(find_compute_sanitizer); then
    record "d. compute-sanitizer" SKIP "not found (PATH, /usr/local/cuda/bin, pip nvidia packages)"
    return
  fi
  say "compute-sanitizer: $sanitizer" \
    "($("$sanitizer" --version 2>&1 | grep -oE '[0-9]{4}\.[0-9.]+' | head -n 1))"
  # Death tests, the out-of-range label test and the allocation beyond the card make CUDA fail on
  # purpose: the tool would rightly report those errors.
  local filter='--gtest_filter=-*DeathTest*:*OutOfRangeLabel*:*AllocationBeyondTheCard*'
  local tool limit status
  for tool in memcheck racecheck; do
    if [[ ! -x $bin/cuda_kernels_test ]]; then
      record "d. $tool cuda_kernels_test" SKIP "cuda_kernels_test is not in the bundle"
      continue
    fi
    if ! limit=$(step_limit 120 30); then
      record "d. $tool cuda_kernels_test" SKIP "no time left in the budget"
      continue
    fi
    local sanitizer_log=$log_dir/sanitizer-$tool-cuda_kernels_test.log
    run_logged "$limit" "$sanitizer_log" "$sanitizer" --tool "$tool" "$bin/cuda_kernels_test" \
      --gtest_brief=1 "$filter"
    status=$?
    sanitizer_verdict "d. $tool cuda_kernels_test" "$status" "$limit" "$sanitizer_log"
  done
  # A short cuda training under `lockstep run`: the worker is lockstep's child, hence
  # --target-processes all.
  local dir=$log_dir/sanitizer-train
  mkdir -p "$dir"
  local name="d. memcheck lockstep run (cuda, $sanitizer_steps steps)"
  if ! make_manifest "$dir/manifest.yaml" cuda "$sanitizer_steps" >"$dir/make-manifest.log" 2>&1
  then
    record "$name" FAIL "manifest: $(failure_reason "$dir")"
    return
  fi
  if ! limit=$(step_limit 150 45); then
    record "$name" SKIP "no time left in the budget"
    return
  fi
  # --report-api-errors no: NCCL's initialisation probes kernel images for other architectures
  # and handles the cudaErrorNoKernelImageForDevice it gets (8 such reports, all inside
  # libnccl's ncclInitKernelsForDevice, on an H100 with PyTorch's NCCL); memory access errors are
  # still reported. cuda_kernels_test above keeps API errors reported: nothing there expects one.
  run_logged "$limit" "$dir/sanitizer.log" "$sanitizer" --tool memcheck --report-api-errors no \
    --target-processes all "$bin/lockstep" run "$dir/manifest.yaml" --replicas 1 --summary "$dir/summary.json" \
    --log-dir "$dir/run"
  status=$?
  sanitizer_verdict "$name" "$status" "$limit" "$dir/sanitizer.log" "$dir"/run/worker-*.log
}

# ---------------------------------------------------------------------------------------------

if $selftest; then
  train_step
  kill_step
else
  gtest_step cuda_kernels_test true 120
  gtest_step comm_nccl_communicator_test true 120
  gtest_step trainer_device_test true 180
  gtest_step kernels_test false 120
  train_step
  kill_step
  kernel_bench_step
  step_time_step
  sanitizer_step
fi

publish
if [[ -n ${OUT:-} ]]; then
  say "logs: \$OUT/logs.tar.gz; summary: \$OUT/summary.txt"
fi
echo
cat "$result_dir/summary.txt"
((failures == 0)) || exit 1
exit 0
