"""`python3 scripts/gpu_check [ARGS]` (what scripts/gpu-check.sh runs): see __init__.py."""
import os
import sys

# Run as a folder, Python puts this folder first on sys.path; put its parent there instead, so
# that the modules are imported as the package gpu_check, as the tests import them.
sys.path[0] = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from gpu_check.main import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
