"""gpu-check: Lockstep's checks on a lent GPU machine, in one command and under 10 minutes.

    scripts/gpu-check.sh                    from the repository root, with the archive of
                                            scripts/gpu-bundle.sh in gpu-bundle/
    scripts/gpu-check.sh --bundle ARCHIVE   another archive
    scripts/gpu-check.sh --cpu-selftest     on a machine without a GPU: only steps b and c, with
                                            device cpu, to check this program and the bundle
    scripts/gpu-check.sh --steps a,b,f      only these steps (letters or whole labels)

With the device tool: run(command="scripts/gpu-check.sh", carry=["gpu-bundle"]). The GPU machine
has Python 3.12 and PyTorch but nothing else of ours, so this package uses the standard library
only (and runs on Debian's Python 3.11, where its tests run: tests/python/test_gpu_check_*.py).

Contract:
- Environment: OUT (set by the device tool: the results go there), LOCKSTEP_GPU_CHECK_BUDGET_S
  (the whole run's budget in seconds, default 540).
- Steps (steps.py), in this order: a. the gtest programs, b. `lockstep run` on cpu, cuda and
  cuda in bf16 (bf16 against fp32 over four seeds), f. train_step_bench against PyTorch (fp32,
  bf16, checkpoint cost), g. exec mode on the machine's PyTorch, e. kernels_cuda_bench, c. the
  kill test, d. compute-sanitizer. Each program runs under its own time limit, all within the
  budget less a reserve for the summary (budget.py); one that would not fit is skipped, saying
  so.
- Output: each step's log under $OUT/logs when OUT is set (kept in /tmp/lockstep-gpu/logs and
  packed into $OUT/logs.tar.gz after every step, so that $OUT holds two files: summary.txt and
  logs.tar.gz), else under build/gpu-check/. The summary (machine, step table, figures;
  report.py) is printed last: the device tool returns only the end of the output.
- Exit status: 0 every step passed or was skipped; 1 a step failed; 2 refused (no GPU here, no
  archive, bad arguments).

Modules, by concern: main (command line, the run from start to summary), machine (the GPU, the
bundle, the libraries), budget (each step's time limit), process (running programs under a
limit), steps (what each step runs), verdicts (what the programs printed, and the rule for each
row), manifest (the training runs' manifests), report (rows, sections, summary.txt, logs.tar.gz).
"""
