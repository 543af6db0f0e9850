#!/usr/bin/env bash
# Lockstep's checks on a GPU machine, in one command and under 10 minutes.
#
#   scripts/gpu-check.sh                    from the repository root, with the archive of
#                                           scripts/gpu-bundle.sh in gpu-bundle/
#   scripts/gpu-check.sh --bundle ARCHIVE   another archive
#   scripts/gpu-check.sh --cpu-selftest     on a machine without a GPU: only steps b and c, with
#                                           device cpu, to check this script and the bundle
#   scripts/gpu-check.sh --steps a,b,f      only these steps (letters or whole labels)
#
# With the device tool: run(command="scripts/gpu-check.sh", carry=["gpu-bundle"]).
# The program is the Python package scripts/gpu_check/ (standard library only: the GPU machine
# has Python but none of our packages); its __init__.py states the steps, the output and the exit
# status (0 passed or skipped, 1 a step failed, 2 refused). This file keeps the command the docs
# and the device tool name.
exec python3 "$(dirname "${BASH_SOURCE[0]}")/gpu_check" "$@"
