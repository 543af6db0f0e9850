#!/usr/bin/env python3
"""Checks the Dockerfile without a Docker engine (none runs here).

    dockerfile_test.py --dockerfile Dockerfile --stage worker=BIN[,BIN...] [--stage operator=BIN]

For each runtime stage given, with the build's binaries that the stage copies:
  - the stages build, operator and worker exist (so --target operator|worker works);
  - the agent stage starts from scratch, copies only the agent's bundle to /lockstep and runs as
    a non-root uid;
  - the stage's last USER is a non-root uid;
  - it installs no compiler, build tool or -dev package;
  - the packages of its "# runtime libraries" RUN are exactly the packages owning the shared
    libraries `ldd` lists for its binaries (dpkg -S on this machine); other installs are only
    the documented run-time extras (RUNTIME_EXTRAS);
  - it copies from the build stage only the binaries it is checked with.
A binary path that does not exist makes the script exit 77 (ctest: skipped) after the other
stages were checked, naming what is missing.
"""
import argparse
import functools
import os
import re
import shlex
import subprocess
import sys

# Installed in runtime stages although `ldd` does not list them, with the reason.
RUNTIME_EXTRAS = {
    "ca-certificates": "TLS roots for apt (NVIDIA's https repository) and WebHDFS over https",
    "libnccl2": "NCCL: loaded by the NCCL communicator (worker/comm/nccl)",
    "ibverbs-providers": "RDMA NIC drivers (mlx5, ...) that libibverbs dlopens for RoCE/InfiniBand",
    "dataset-fashion-mnist": "the data examples/fashion-mnist.yaml reads",
    "python3": "exec-mode programs in the CPU worker image (from lockstep import progress)",
}

# Shared libraries of the CUDA toolkit, installed here from NVIDIA's tarball (not dpkg), and the
# packages of NVIDIA's Debian 12 repository that ship them ({cuda} is e.g. 13-0).
NVIDIA_PACKAGES = {
    "libcudart.so": "cuda-cudart-{cuda}",
    "libcublas.so": "libcublas-{cuda}",
    "libcublasLt.so": "libcublas-{cuda}",
    "libnccl.so": "libnccl2",
}

# NVIDIA packages a CUDA build opens with dlopen instead of linking, so `ldd` does not list them,
# with the reason.
NVIDIA_DLOPENED = {
    "libcublas-{cuda}": "cuBLAS: opened by the first CUDA device (kernels/cuda/cublas_library.h)",
}

BUILD_TOOLS = re.compile(
    r"^(gcc(-\d+)?|g\+\+(-\d+)?|cpp(-\d+)?|clang(-\d+)?|cmake|make|ninja-build|build-essential"
    r"|binutils|pkg-config|protobuf-compiler.*|cuda-nvcc.*|cuda-toolkit.*|cuda-compiler.*"
    r"|cuda-libraries-dev.*|.*-dev)$"
)


class Stage:
    def __init__(self, name, base):
        self.name, self.base = name, base
        self.instructions = []  # (keyword, arguments, comment lines before it)


def parse_dockerfile(path):
    """Stages with their instructions; line continuations joined, ARG defaults collected."""
    stages, args, comments = {}, {}, []
    current = None
    logical = ""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    for raw in lines:
        line = raw.rstrip()
        stripped = line.strip()
        if not logical and stripped.startswith("#"):
            comments.append(stripped)
            continue
        if logical and stripped.startswith("#"):
            continue  # comment inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        text = logical.strip()
        logical = ""
        if not text:
            comments = []
            continue
        keyword, _, rest = text.partition(" ")
        keyword = keyword.upper()
        rest = rest.strip()
        if keyword == "FROM":
            match = re.match(r"(\S+)\s+AS\s+(\S+)$", rest, re.I)
            if not match:
                raise SystemExit("FROM without AS name: %r" % text)
            current = Stage(match.group(2), match.group(1))
            stages[current.name] = current
        elif keyword == "ARG":
            name, _, default = rest.partition("=")
            if default or name not in args:
                args[name] = default.strip('"')
            if current:
                current.instructions.append((keyword, rest, comments))
        elif current is not None:
            current.instructions.append((keyword, rest, comments))
        comments = []
    return stages, args


def expand(text, args):
    return re.sub(r"\$\{(\w+)\}", lambda m: args.get(m.group(1), m.group(0)), text)


def apt_packages(run_text, args):
    """Packages named by every `apt-get install` of one RUN."""
    packages = []
    for command in re.split(r"&&|;", expand(run_text, args)):
        words = shlex.split(command)
        if "apt-get" in words and "install" in words:
            after = words[words.index("install") + 1 :]
            packages += [w for w in after if not w.startswith("-")]
    return packages


@functools.lru_cache(maxsize=None)
def owning_package(library, cuda_suffix):
    """The package that ships a shared library, and how it was found. Remembered: each dpkg -S
    reads every package's file list (a third of a second here), and two binaries of two stages
    share most of their libraries."""
    candidates = []
    for path in (library, os.path.realpath(library)):
        candidates += [path]
        if path.startswith("/usr/"):
            candidates.append(path[len("/usr") :])
        else:
            candidates.append("/usr" + path)
    # One dpkg -S for every candidate (it exits 1 when any is unowned, and still lists the rest):
    # "pkg:arch: /path" or "pkg1, pkg2: /path" (diversions) per line; the first owner counts.
    result = subprocess.run(["dpkg", "-S", *candidates], capture_output=True, text=True)
    owners = {}
    for line in result.stdout.splitlines():
        owner, _, path = line.rpartition(": ")
        if owner and path not in owners:
            owners[path] = owner.split(":")[0].split(",")[0].strip()
    for candidate in candidates:
        if candidate in owners:
            return owners[candidate], "dpkg"
    base = os.path.basename(library)
    for prefix, package in NVIDIA_PACKAGES.items():
        if base.startswith(prefix + "."):
            return package.format(cuda=cuda_suffix), "nvidia"
    return None, None


def needed_libraries(binary):
    result = subprocess.run(["ldd", binary], capture_output=True, text=True, check=True)
    libraries, missing = [], []
    for line in result.stdout.splitlines():
        line = line.strip()
        if "=> not found" in line:
            missing.append(line.split()[0])
        elif "=>" in line:
            path = line.split("=>")[1].split("(")[0].strip()
            if path:
                libraries.append(path)
        elif line.startswith("/"):
            libraries.append(line.split()[0])  # the dynamic loader itself (libc6)
    return libraries, missing


def check_stage(stage, binaries, args, failures):
    def fail(message):
        failures.append("stage %s: %s" % (stage.name, message))

    users = [rest for keyword, rest, _ in stage.instructions if keyword == "USER"]
    if not users:
        fail("no USER: the image would run as root")
    else:
        user = expand(users[-1], args).split(":")[0]
        if user in ("0", "root") or not user:
            fail("USER %s is root" % users[-1])

    library_packages, other_packages = None, []
    for keyword, rest, comments in stage.instructions:
        if keyword != "RUN":
            continue
        packages = apt_packages(rest, args)
        for package in packages:
            if BUILD_TOOLS.match(package):
                fail("installs build tool or development package %s" % package)
        if any(c.startswith("# runtime libraries") for c in comments):
            if library_packages is not None:
                fail("two RUNs marked '# runtime libraries'")
            library_packages = set(packages) - {"ca-certificates"}
            other_packages += [p for p in packages if p == "ca-certificates"]
        else:
            other_packages += packages
    if library_packages is None:
        fail("no RUN marked '# runtime libraries'")
        return
    for package in other_packages:
        if package not in RUNTIME_EXTRAS:
            fail("installs %s, which no binary needs and which is not a documented run-time extra"
                 % package)

    copied = []
    for keyword, rest, _ in stage.instructions:
        if keyword == "COPY" and "--from=build" in rest:
            sources = [w for w in shlex.split(rest) if not w.startswith("--")][:-1]
            copied += [os.path.basename(s) for s in sources]
    if sorted(copied) != sorted(os.path.basename(b) for b in binaries):
        fail("copies %s from the build stage; the test checks %s" %
             (sorted(copied), sorted(os.path.basename(b) for b in binaries)))

    cuda_suffix = args.get("CUDA_PACKAGE_VERSION", "")
    # A stage that copies from build-cpu gets binaries without CUDA, whatever this build linked.
    cpu_only = any(keyword == "COPY" and "--from=build-cpu" in rest
                   for keyword, rest, _ in stage.instructions)
    needed, sources = {}, {}
    links_cuda = False
    for binary in binaries:
        libraries, missing = needed_libraries(binary)
        for name in missing:
            fail("%s: ldd cannot resolve %s on this machine" % (binary, name))
        for library in libraries:
            package, how = owning_package(library, cuda_suffix)
            if package is None:
                fail("%s needs %s, which no Debian or NVIDIA package ships" % (binary, library))
                continue
            if how == "nvidia" and cpu_only:
                continue  # the CPU stage copies binaries built without CUDA (build-cpu)
            needed[package] = how
            sources.setdefault(package, []).append(os.path.basename(library))
            links_cuda |= how == "nvidia"
    installed_nvidia = {p for p in library_packages
                        if any(p == t.format(cuda=cuda_suffix) for t in NVIDIA_PACKAGES.values())}
    missing = sorted(set(needed) - library_packages)
    extra = sorted(library_packages - set(needed) - installed_nvidia)
    if missing:
        fail("runtime libraries lack %s (needed for %s)" %
             (missing, {p: sorted(set(sources[p])) for p in missing}))
    if extra:
        fail("runtime libraries install %s, which no copied binary links" % extra)
    dlopened = {p.format(cuda=cuda_suffix) for p in NVIDIA_DLOPENED}
    unused_nvidia = sorted(installed_nvidia - set(needed) - (dlopened if links_cuda else set()))
    if links_cuda and dlopened - library_packages:
        fail("runtime libraries lack %s, which the CUDA build opens with dlopen (%s)" %
             (sorted(dlopened - library_packages),
              "; ".join(NVIDIA_DLOPENED[p] for p in NVIDIA_DLOPENED
                        if p.format(cuda=cuda_suffix) in dlopened - library_packages)))
    if unused_nvidia and links_cuda:
        fail("installs %s, which the CUDA build of the binaries does not link" % unused_nvidia)
    print("stage %s: %d runtime packages = ldd of %s" %
          (stage.name, len(library_packages), ", ".join(os.path.basename(b) for b in binaries)))
    if unused_nvidia and not links_cuda:
        print("stage %s: these binaries were built without CUDA, so %s (the CUDA build's "
              "libraries) are not compared with ldd; build with nvcc to check them" %
              (stage.name, unused_nvidia))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dockerfile", required=True)
    parser.add_argument("--stage", action="append", default=[],
                        help="NAME=BINARY[,BINARY...]: a runtime stage and the build's binaries it copies")
    options = parser.parse_args()
    stages, args = parse_dockerfile(options.dockerfile)
    failures, absent = [], []
    for required in ("build", "build-cpu", "operator", "worker", "worker-cpu"):
        if required not in stages:
            failures.append("no stage named %s (docker build --target %s)" % (required, required))
    for name in ("operator", "worker"):
        if name in stages and not stages[name].base.startswith("debian:"):
            failures.append("stage %s starts from %s, not a Debian image" % (name, stages[name].base))
    # The agent image: the agent's bundle alone (it brings its own glibc and loader), on no base.
    agent = stages.get("agent")
    if agent is None:
        failures.append("no stage named agent (docker build --target agent)")
    else:
        if agent.base != "scratch":
            failures.append("stage agent starts from %s, not scratch" % agent.base)
        users = [rest for keyword, rest, _ in agent.instructions if keyword == "USER"]
        if not users or users[-1].split(":")[0] in ("0", "root"):
            failures.append("stage agent: its last USER must be a non-root uid")
        copies = [rest for keyword, rest, _ in agent.instructions if keyword == "COPY"]
        if copies != ["--from=build-cpu /src/agent /lockstep"]:
            failures.append("stage agent copies %s; it must copy the bundle alone to /lockstep, "
                            "where its loader is named" % copies)
    for spec in options.stage:
        name, _, paths = spec.partition("=")
        binaries = [p for p in paths.split(",")]
        if name not in stages:
            failures.append("no stage %s" % name)
            continue
        unbuilt = [b for b in binaries if not b or not os.path.isfile(b)]
        if unbuilt:
            absent.append("stage %s: %s not built (%s); its runtime libraries cannot be compared "
                          "with ldd" % (name, ", ".join(unbuilt) or "binary", "build it first"))
            continue
        check_stage(stages[name], binaries, args, failures)
    for failure in failures:
        print("FAIL " + failure)
    if failures:
        return 1
    if absent:
        for line in absent:
            print("SKIP " + line)
        return 77
    print("Dockerfile: stages, users, packages and binaries agree with the build")
    return 0


if __name__ == "__main__":
    sys.exit(main())
