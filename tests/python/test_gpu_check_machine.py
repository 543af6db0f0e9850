"""scripts/gpu_check's view of the machine: is there a GPU, where each CUDA library comes from,
the loader's trace, BUNDLE-INFO. Stand-in tools and folders; run by CTest's python_helpers.
"""
import os
import stat
import sys
import tarfile
import tempfile
import unittest
from unittest import mock

SCRIPTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts")
sys.path.insert(0, SCRIPTS)

from gpu_check import machine  # noqa: E402

LDCONFIG = """\
1234 libs found in cache `/etc/ld.so.cache'
\tlibnccl.so.2 (libc6) => /usr/lib/i386-linux-gnu/libnccl.so.2
\tlibnccl.so.2 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libnccl.so.2
\tlibcuda.so.1 (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/libcuda.so.1
\tlibcudart.so.13.0 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.13.0
"""


def touch(path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    open(path, "w").close()
    return path


class CudaLibrariesTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.root = self.tmp.name

    def test_pip_packages_come_first_then_the_toolkit_then_the_loader_cache(self):
        nvidia = os.path.join(self.root, "nvidia")
        pip_cudart = touch(os.path.join(nvidia, "cu13", "lib", "libcudart.so.13"))
        toolkit = os.path.join(self.root, "cuda", "lib64")
        touch(os.path.join(toolkit, "libcudart.so.13"))
        toolkit_cublas = touch(os.path.join(toolkit, "libcublas.so.13"))
        found = machine.find_cuda_libraries(
            ["libcudart.so.13", "libcublas.so.13", "libnccl.so.2", "libcublasLt.so.13"],
            [os.path.join(self.root, "absent"), nvidia], [toolkit], LDCONFIG)
        self.assertEqual(found, [("libcudart.so.13", pip_cudart),
                                 ("libcublas.so.13", toolkit_cublas),
                                 ("libnccl.so.2", "/usr/lib/x86_64-linux-gnu/libnccl.so.2"),
                                 ("libcublasLt.so.13", None)])

    def test_a_pip_package_is_searched_three_levels_deep_first_path_in_order(self):
        nvidia = os.path.join(self.root, "nvidia")
        touch(os.path.join(nvidia, "a", "b", "c", "libnccl.so.2"))  # 4 levels: not found
        self.assertEqual(machine.find_cuda_libraries(["libnccl.so.2"], [nvidia], [], ""),
                         [("libnccl.so.2", None)])
        second = touch(os.path.join(nvidia, "nccl", "lib", "libnccl.so.2"))
        touch(os.path.join(nvidia, "zz", "lib", "libnccl.so.2"))
        self.assertEqual(machine.find_cuda_libraries(["libnccl.so.2"], [nvidia], [], ""),
                         [("libnccl.so.2", second)])

    def test_ld_library_path_names_the_bundle_then_each_folder_once(self):
        self.assertEqual(machine.library_path_for("/tmp/w", [
            ("libcudart.so.13", "/p/cu13/lib/libcudart.so.13"),
            ("libcublas.so.13", "/p/cu13/lib/libcublas.so.13"),
            ("libnccl.so.2", None), ("libnccl.so.2", "/p/nccl/lib/libnccl.so.2")]),
            "/tmp/w/lib:/p/cu13/lib:/p/nccl/lib")

    def test_the_loader_cache_entry_is_the_x86_64_one(self):
        self.assertEqual(machine.ldconfig_lookup(LDCONFIG, "libcuda.so.1"),
                         "/usr/lib/x86_64-linux-gnu/libcuda.so.1")
        self.assertEqual(machine.ldconfig_lookup(LDCONFIG, "libnccl.so.2"),
                         "/usr/lib/x86_64-linux-gnu/libnccl.so.2")
        self.assertIsNone(machine.ldconfig_lookup(LDCONFIG, "libcudart.so.13"))  # not .13.0

    def test_the_bundle_adds_the_cuda_libraries_it_needs(self):
        info = machine.read_bundle_info(touch(os.path.join(self.root, "none")))
        self.assertEqual(info, {})
        path = os.path.join(self.root, "BUNDLE-INFO")
        with open(path, "w") as f:
            f.write("commit=abc (with uncommitted changes)\ncuda_libraries=libcublas.so.13 "
                    "libcufft.so.12 \nglibc_required=2.34\n")
        info = machine.read_bundle_info(path)
        self.assertEqual(info["commit"], "abc (with uncommitted changes)")
        self.assertEqual(machine.cuda_library_names(info),
                         ["libcudart.so.13", "libcublas.so.13", "libcublasLt.so.13",
                          "libnccl.so.2", "libcufft.so.12"])


class UnpackTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.archive = os.path.join(self.tmp.name, "bundle.tar.xz")
        program = touch(os.path.join(self.tmp.name, "stage", "bin", "lockstep"))
        os.chmod(program, 0o755)
        with tarfile.open(self.archive, "w:xz") as tar:
            tar.add(os.path.join(self.tmp.name, "stage", "bin"), arcname="bin")
        self.work = os.path.join(self.tmp.name, "work")
        touch(os.path.join(self.work, "left-over-from-the-last-run"))

    def check_unpacked(self):
        self.assertEqual(sorted(os.listdir(self.work)), ["bin"])
        self.assertTrue(os.access(os.path.join(self.work, "bin", "lockstep"), os.X_OK))

    def test_with_the_xz_tool(self):
        self.assertIsNone(machine.unpack(self.archive, self.work))
        self.check_unpacked()

    def test_with_python_where_xz_is_missing(self):
        with mock.patch.object(machine.shutil, "which", return_value=None):
            self.assertIsNone(machine.unpack(self.archive, self.work))
        self.check_unpacked()

    def test_a_broken_archive_says_so(self):
        with open(self.archive, "wb") as f:
            f.write(b"not an archive")
        self.assertIn("cannot unpack", machine.unpack(self.archive, self.work))
        with mock.patch.object(machine.shutil, "which", return_value=None):
            self.assertIn("cannot unpack", machine.unpack(self.archive, self.work))


class LoaderTest(unittest.TestCase):
    def test_the_trace_lines_that_are_problems(self):
        trace = ("\tlinux-vdso.so.1 (0x00007ffd)\n"
                 "\tlibyaml-cpp.so.0.7 => not found\n"
                 "\tlibstdc++.so.6 => /lib/libstdc++.so.6 (0x7f)\n"
                 "/lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found "
                 "(required by ./lockstep)\n"
                 "undefined symbol: ncclCommFinalize\t(./lockstep)\n")
        self.assertEqual(machine.trace_problems("lockstep", trace), [
            "lockstep: libyaml-cpp.so.0.7 => not found",
            "lockstep: /lib/libstdc++.so.6: version `GLIBCXX_3.4.32' not found (required by "
            "./lockstep)",
            "lockstep: undefined symbol: ncclCommFinalize\t(./lockstep)"])

    def test_this_machines_gcc_runtime_is_kept_unless_the_bundles_does_better(self):
        self.assertFalse(machine.prefer_bundled_gcc_runtime([], []))
        self.assertTrue(machine.prefer_bundled_gcc_runtime(["a: GLIBCXX"], []))
        self.assertTrue(machine.prefer_bundled_gcc_runtime(["a", "b"], ["c"]))
        self.assertFalse(machine.prefer_bundled_gcc_runtime(["a"], ["c"]))
        self.assertFalse(machine.prefer_bundled_gcc_runtime(["a"], ["c", "d"]))


class GpuPresenceTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.tools = os.path.join(self.tmp.name, "tools")
        os.makedirs(self.tools)
        self.device = touch(os.path.join(self.tmp.name, "dev", "nvidia0"))
        self.device_glob = os.path.join(self.tmp.name, "dev", "nvidia[0-9]*")

    def nvidia_smi(self, listing, status=0):
        path = os.path.join(self.tools, "nvidia-smi")
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\nprintf '%s\\n' '{listing}'\nexit {status}\n")
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)

    def reason(self, torch=machine.TorchInfo(None, None)):
        with mock.patch.dict(os.environ, {"PATH": self.tools}):
            return machine.gpu_missing_reason(self.device_glob, torch=lambda: torch)

    def test_a_gpu_listed_by_nvidia_smi_with_a_device_node_is_usable(self):
        self.nvidia_smi("GPU 0: NVIDIA H200 (UUID: GPU-1)")
        self.assertIsNone(self.reason())
        self.assertIsNone(self.reason(machine.TorchInfo("2.11.0", True)))

    def test_no_driver(self):
        self.assertEqual(self.reason(), "nvidia-smi is not on PATH (no NVIDIA driver installed)")

    def test_no_device_node(self):
        self.nvidia_smi("GPU 0: NVIDIA H200 (UUID: GPU-1)")
        os.remove(self.device)
        self.assertEqual(self.reason(), "no /dev/nvidia<N> device node (no GPU visible to this "
                                        "machine or container)")

    def test_nvidia_smi_listing_no_gpu(self):
        self.nvidia_smi("No devices were found", status=6)
        self.assertEqual(self.reason(), "nvidia-smi -L lists no GPU: No devices were found")

    def test_torch_not_seeing_the_gpu(self):
        self.nvidia_smi("GPU 0: NVIDIA H200 (UUID: GPU-1)")
        self.assertEqual(self.reason(machine.TorchInfo("2.11.0", False)),
                         "torch.cuda.is_available() is false although nvidia-smi lists a GPU "
                         "(driver/CUDA mismatch?)")


if __name__ == "__main__":
    unittest.main()
