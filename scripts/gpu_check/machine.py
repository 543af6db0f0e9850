"""The machine the check runs on: is there a GPU, the bundle unpacked, and where each library the
programs need comes from.

The GPU machine has an NVIDIA driver, CUDA 13 libraries (in PyTorch's pip packages, maybe a
toolkit in /usr/local/cuda) and PyTorch, but none of our Debian libraries: those come in the
archive of scripts/gpu-bundle.sh, unpacked into /tmp/lockstep-gpu (left there for inspection; the
next run replaces it). CUDA, cuBLAS and NCCL are that machine's own: they must match its driver.
"""
import glob
import importlib.util
import os
import platform
import re
import shutil
import tarfile
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .process import run_captured

# The libraries the programs need from the machine (the archive's BUNDLE-INFO adds its own).
CUDA_LIBRARY_NAMES = ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13", "libnccl.so.2"]
CUDA_TOOLKIT_DIRS = ["/usr/local/cuda/lib64", "/usr/local/cuda/lib",
                     "/usr/local/cuda/targets/x86_64-linux/lib"]
LOADER = "/lib64/ld-linux-x86-64.so.2"
QUERY_TIMEOUT_S = 60   # nvidia-smi, ldconfig, the loader's trace, `lockstep version`
TORCH_TIMEOUT_S = 120  # importing torch can take a while on a cold machine
UNPACK_TIMEOUT_S = 180


class TorchInfo(NamedTuple):
    version: Optional[str]          # None: python3 here cannot import torch
    cuda_available: Optional[bool]


def probe_torch() -> TorchInfo:
    """PyTorch as python3 sees it here, in a child process (importing it would load CUDA into
    the check itself), with the environment as it is now (LD_LIBRARY_PATH included)."""
    status, out = run_captured(
        ["python3", "-c", "import torch; print(torch.__version__); "
                          "print(torch.cuda.is_available())"], TORCH_TIMEOUT_S, stderr_too=False)
    lines = out.split()
    if status != 0 or len(lines) < 2:
        return TorchInfo(None, None)
    return TorchInfo(lines[0], lines[1] == "True")


def gpu_missing_reason(device_glob: str = "/dev/nvidia[0-9]*", torch=probe_torch) -> Optional[str]:
    """Why this machine cannot run the GPU steps; None when it can."""
    if shutil.which("nvidia-smi") is None:
        return "nvidia-smi is not on PATH (no NVIDIA driver installed)"
    if not glob.glob(device_glob):
        return "no /dev/nvidia<N> device node (no GPU visible to this machine or container)"
    status, listing = run_captured(["nvidia-smi", "-L"], QUERY_TIMEOUT_S)
    if status != 0 or not re.search(r"^GPU [0-9]", listing, re.M):
        return f"nvidia-smi -L lists no GPU: {listing.rstrip(chr(10))[:300].rstrip(chr(10))}"
    # PyTorch's view, when it is installed (it is the peer of step f; without it, f is skipped).
    info = torch()
    if info.version is not None and not info.cuda_available:
        return ("torch.cuda.is_available() is false although nvidia-smi lists a GPU "
                "(driver/CUDA mismatch?)")
    return None


def unpack(bundle: str, work: str) -> Optional[str]:
    """Unpacks the archive into a fresh `work`; returns why it could not, or None."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work, exist_ok=True)
    if shutil.which("xz"):
        status, out = run_captured(["tar", "-C", work, "-xJf", bundle], UNPACK_TIMEOUT_S)
        return None if status == 0 else f"cannot unpack {bundle}: {out.strip()[:300]}"
    try:  # Python's tarfile reads xz (lzma) where the xz tool is missing
        with tarfile.open(bundle) as tar:
            if hasattr(tarfile, "data_filter"):
                tar.extractall(work, filter="tar")
            else:
                tar.extractall(work)
        return None
    except (OSError, tarfile.TarError) as error:
        return f"cannot unpack {bundle} (no xz, and Python failed: {error})"


def read_bundle_info(path: str) -> Dict[str, str]:
    """BUNDLE-INFO's key=value lines; {} when there is no such file."""
    info: Dict[str, str] = {}
    try:
        with open(path) as f:
            for line in f:
                key, sep, value = line.rstrip("\n").partition("=")
                if sep and key not in info:
                    info[key] = value
    except OSError:
        pass
    return info


def cuda_library_names(bundle_info: Dict[str, str]) -> List[str]:
    names = list(CUDA_LIBRARY_NAMES)
    for name in bundle_info.get("cuda_libraries", "").split():
        if name not in names:
            names.append(name)
    return names


def nvidia_package_roots() -> List[str]:
    """The folders of the `nvidia` namespace package (PyTorch's pip CUDA libraries)."""
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None or spec.submodule_search_locations is None:
        return []
    return list(spec.submodule_search_locations)


def find_named(root: str, name: str, max_depth: int, executable_file: bool = False) -> List[str]:
    """Paths under root named `name`, at most max_depth levels down (as find -maxdepth), sorted."""
    found = []
    root = root.rstrip("/") or "/"
    base_depth = root.count("/")
    for folder, dirs, files in os.walk(root):
        depth = folder.rstrip("/").count("/") - base_depth + 1  # of the entries in folder
        for entry in files + dirs:
            path = os.path.join(folder, entry)
            if entry == name and (not executable_file or (os.path.isfile(path)
                                                          and os.access(path, os.X_OK))):
                found.append(path)
        if depth >= max_depth:
            dirs[:] = []
    return sorted(found)


def ldconfig_listing() -> str:
    """`ldconfig -p`: the loader's cache ("" when there is no ldconfig)."""
    program = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.access("/sbin/ldconfig",
                                                                           os.X_OK) else None)
    if program is None:
        return ""
    status, out = run_captured([program, "-p"], QUERY_TIMEOUT_S, stderr_too=False)
    return out if status == 0 else ""


def ldconfig_lookup(listing: str, name: str) -> Optional[str]:
    """The x86-64 entry for `name` in `ldconfig -p` output:
    '\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1'."""
    for line in listing.splitlines():
        fields = line.split()
        if fields and fields[0] == name and "x86-64" in line:
            return fields[-1]
    return None


def find_cuda_libraries(names: Sequence[str], package_roots: Sequence[str],
                        toolkit_dirs: Sequence[str],
                        ldconfig: str) -> List[Tuple[str, Optional[str]]]:
    """Where each CUDA library is, in this order: PyTorch's pip packages (the set torch itself runs
    with on this machine's driver: nvidia/<package>/lib, e.g. nvidia/cu13/lib, nvidia/nccl/lib),
    then a CUDA toolkit, then the loader's cache. (name, path or None) for each name."""
    result = []
    for name in names:
        found = None
        for root in package_roots:
            if os.path.isdir(root):
                paths = find_named(root, name, max_depth=3)
                if paths:
                    found = paths[0]
                    break
        if found is None:
            for folder in toolkit_dirs:
                if os.path.exists(os.path.join(folder, name)):
                    found = os.path.join(folder, name)
                    break
        if found is None:
            found = ldconfig_lookup(ldconfig, name)
        result.append((name, found))
    return result


def library_path_for(work: str, libraries: Sequence[Tuple[str, Optional[str]]]) -> str:
    """LD_LIBRARY_PATH: the bundle's lib/, then the folder of each CUDA library found."""
    parts = [os.path.join(work, "lib")]
    for _, path in libraries:
        if path is not None and os.path.dirname(path) not in parts:
            parts.append(os.path.dirname(path))
    return ":".join(parts)


def loader_problems(bin_dir: str, library_path: str) -> List[str]:
    """"program: problem" for each library or symbol a program would not find with this
    LD_LIBRARY_PATH, from the loader's trace (as `ldd -r`), before any step fails on it."""
    if not os.access(LOADER, os.X_OK):
        return []
    problems = []
    for program in sorted(glob.glob(os.path.join(bin_dir, "*"))):
        env = dict(os.environ, LD_TRACE_LOADED_OBJECTS="1", LD_WARN="yes", LD_BIND_NOW="yes",
                   LD_LIBRARY_PATH=library_path)
        _, trace = run_captured([LOADER, program], QUERY_TIMEOUT_S, env=env)
        problems += trace_problems(os.path.basename(program), trace)
    return problems


def trace_problems(program: str, trace: str) -> List[str]:
    """The lines of a loader trace that name a library not found or a symbol missing:
    '\tlibyaml-cpp.so.0.7 => not found', 'undefined symbol: ncclCommFinalize (./lockstep)'."""
    return [f"{program}: {line.lstrip()}" for line in trace.splitlines()
            if re.search(r"not found|undefined symbol", line)]


def prefer_bundled_gcc_runtime(problems: Sequence[str], fallback_problems: Sequence[str]) -> bool:
    """Whether to add the bundle's lib/gcc-fallback: this machine's own GCC runtime is preferred
    (cuBLAS or NCCL, loaded into the same process, may need the newer one; gpu-bundle.sh explains),
    unless the loader finds problems with it that the fallback removes or lessens."""
    return bool(problems) and (not fallback_problems or len(fallback_problems) < len(problems))


def glibc_version() -> str:
    try:
        return os.confstr("CS_GNU_LIBC_VERSION").split()[1]
    except (ValueError, OSError, IndexError, AttributeError):
        return ""


def cpu_count() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 0


def gpu_lines() -> List[str]:
    """The summary's lines about the GPU and its driver, from nvidia-smi."""
    _, query = run_captured(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,"
                             "compute_cap", "--format=csv,noheader"], QUERY_TIMEOUT_S)
    _, full = run_captured(["nvidia-smi"], QUERY_TIMEOUT_S, stderr_too=False)
    driver = re.search(r"Driver Version: [0-9.]+ +CUDA Version: [0-9.]+", full)
    return [f"gpu: {';'.join(query.splitlines()[:4])}",
            f"driver: {driver.group(0) if driver else ''}"]


def nvidia_smi_output() -> str:
    return run_captured(["nvidia-smi"], QUERY_TIMEOUT_S)[1]


def host_line(bundle_info: Dict[str, str], torch_version: Optional[str]) -> str:
    return (f"host: {platform.uname().release}, {cpu_count()} cores, "
            f"glibc {glibc_version() or '?'} "
            f"(the bundle needs {bundle_info.get('glibc_required') or '?'}); python3 "
            f"{platform.python_version()}; torch {torch_version or 'absent'}")


def find_compute_sanitizer() -> Optional[str]:
    """compute-sanitizer on PATH, in a CUDA toolkit, or in pip's nvidia-cuda-sanitizer-api."""
    for candidate in (shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer",
                      "/usr/local/cuda/compute-sanitizer/compute-sanitizer"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    for root in nvidia_package_roots():
        if os.path.isdir(root):
            found = find_named(root, "compute-sanitizer", max_depth=4, executable_file=True)
            if found:
                return found[0]
    return None
