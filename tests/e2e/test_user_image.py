"""A PyTorch user's own image on the real cluster: examples/pytorch/Dockerfile (Debian trixie's
python3-torch 2.6, the example's scripts, no Lockstep), built and loaded by the e2e fixture
(tests/e2e/cluster_up.sh) as a user loads an image into kind.

- The image holds nothing of Lockstep: no file of that name, and not the libraries the agent
  links (read from the image's own layers).
- examples/pytorch-ddp-cluster.yaml trains in it as 4 pods over both nodes, each brought the
  agent by its init container: progress in `kubectl get tj` while it runs, the loss falls, the
  job ends Succeeded. Prints the time from `kubectl apply` to the first step, and the same for a
  small program in the operator's worker image and in the user's image (what the init container
  costs), and the init container's own copy time.
- The program sees nothing of the agent's loader: its environment has no LD_* variable of the
  agent's and its /proc/self/maps no file under /lockstep; the image's own environment, working
  directory and the template's user are the program's.
- What goes wrong says so, naming the pod: a command not in the image, a command needing a shell
  in an image without one (where a program that needs none runs), an agent volume the init
  container cannot write, a program's traceback, a root image without a user, and an image named
  twice (refused by the webhook).
"""
import json
import os
import re
import shutil
import tarfile
import time
import unittest

import cluster

# A program that reports its progress as train_ddp.py does, without torch: what it costs to
# start it, in the worker image and in the user's image, is the agent's part.
TINY = """
import time
from lockstep import progress
print("first step", flush=True)
for step in range(5):
    progress.report(step=step + 1, samples=step + 1, total_steps=5)
    time.sleep(0.2)
"""

# Libraries the agent links that a PyTorch image has in no version (by name, before ".so").
AGENT_ONLY_LIBRARIES = ("libgrpc++", "libgrpc", "libyaml-cpp", "libprometheus-cpp-core",
                        "libcpprest")


def exec_job(name, command, image=None, replicas=1, backoff_limit=0, template_spec=None):
    job = {"apiVersion": "lockstep.io/v1alpha1", "kind": "TrainingJob",
           "metadata": {"name": name},
           "spec": {"replicas": replicas, "command": command,
                    "runPolicy": {"restartPolicy": "OnFailure", "backoffLimit": backoff_limit}}}
    spec = dict(template_spec or {})
    if image:
        spec.setdefault("containers", []).append({"name": "worker", "image": image})
    if spec:
        job["spec"]["template"] = {"spec": spec}
    return job


def finished(job):
    return cluster.phase(job) in ("Succeeded", "Failed")


class UserImage(unittest.TestCase):
    def test_the_users_image_holds_nothing_of_lockstep(self):
        names = set()
        with tarfile.open(cluster.user_image_archive()) as archive:
            manifest = json.load(archive.extractfile("manifest.json"))
            for layer in manifest[0]["Layers"]:
                with tarfile.open(fileobj=archive.extractfile(layer)) as files:
                    names |= {os.path.basename(m.name) for m in files.getmembers()}
        self.assertFalse([n for n in names if "lockstep" in n.lower()],
                         "files named after Lockstep in the image")
        self.assertIn("python3", names)
        self.assertTrue(any(n.startswith("libtorch") for n in names), "the image has torch")
        stems = {n.split(".so")[0] for n in names if ".so" in n}
        self.assertEqual(stems & set(AGENT_ONLY_LIBRARIES), set(),
                         "libraries of the agent's in the image")
        loaded = cluster.node_exec(cluster.NODES[0], "ctr", "--namespace", "k8s.io",
                                   "images", "ls", "-q")
        self.assertIn(cluster.USER_IMAGE, loaded, "loaded into the nodes")

    def test_ddp_example_trains_in_the_users_image_over_both_nodes(self):
        name = "ddp-user"
        with cluster.Namespace("user-image") as ns:
            job = cluster.spread_over_nodes(cluster.user_image_job(
                ns.name, name, steps=400, extra_args=["--step-delay", "0.05"]))
            # The example's own resources: the init container keeps the pods Guaranteed.
            self.assertEqual(job["spec"]["resources"], {"cpu": "500m", "memory": "1Gi"})
            cluster.shared_volume(ns.name, "checkpoints")
            try:
                applied_at = time.time()
                ns.apply(job)
                running = ns.wait_job(name, "progress while running", lambda j:
                                      cluster.phase(j) == "Running" and cluster.step(j) > 0 and
                                      "loss" in j["status"].get("progress", {}), timeout=300)
                first_loss = running["status"]["progress"]["loss"]
                table = cluster.kubectl("get", "tj", name, "-n", ns.name)
                shown = cluster.table_step(table)
                self.assertIsNotNone(shown, "kubectl get tj shows the step:\n" + table)
                self.assertLess(shown, 400, "seen while it runs:\n" + table)

                done = ns.wait_job(name, "finished", finished, timeout=600)
                self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
                self.assertEqual(cluster.step(done), 400)
                pods = ns.pods(name)
                self.assertEqual(len(pods), 4)
                self.assertEqual({p["spec"]["nodeName"] for p in pods}, set(cluster.NODES))
                for pod in pods:
                    self.assertEqual(pod["spec"]["containers"][0]["image"], cluster.USER_IMAGE)
                    self.assertEqual(pod["spec"]["initContainers"][0]["name"], "lockstep-agent")
                    self.assertEqual(pod["status"]["qosClass"], "Guaranteed")
                logs = "".join(ns.logs(p["metadata"]["name"]) for p in pods)
                final = re.search(r"finished at step 400 \(world 4, loss ([0-9.]+)\)", logs)
                self.assertIsNotNone(final, logs[-3000:])
                self.assertLess(float(final.group(1)), first_loss * 0.8, "the loss falls")

                first_step = cluster.first_stamped_line(ns, name, r"starting at step 0", 0)
                installed = r"installed the agent into \S+: \d+ files, (\d+) KiB in (\d+) ms"
                installs = [re.search(installed, cluster.kubectl(
                    "logs", "-n", ns.name, p["metadata"]["name"], "-c", "lockstep-agent"))
                    for p in pods]
                self.assertTrue(all(installs), "every init container says what it copied")
                print("e2e user image: 4 pods of trixie's torch 2.6 trained 400 steps; kubectl "
                      "apply to the program's first line %.1f s; the init container copied %d KiB "
                      "in %s ms" % (first_step - applied_at, int(installs[0].group(1)),
                                    "/".join(m.group(2) for m in installs)))
            finally:
                cluster.delete_shared_volume(ns.name, "checkpoints")

    def test_a_small_program_runs_in_either_image_and_its_start_is_timed(self):
        """The same small program in the operator's worker image (its lockstep-worker) and in the
        user's image (the agent copied in by the init container) succeeds; the time from apply to
        its first line is printed for each (docs/benchmarks.md; no test asserts a time)."""
        times = {}
        with cluster.Namespace("agent-cost") as ns:
            for label, image in (("worker image", None), ("user image", cluster.USER_IMAGE)):
                name = "tiny-" + label.split()[0]
                template = {"securityContext": {"runAsUser": 1000}} if image else None
                applied_at = time.time()
                ns.apply(exec_job(name, ["python3", "-c", TINY], image=image,
                                  template_spec=template))
                done = ns.wait_job(name, "finished", finished, timeout=180)
                self.assertEqual(cluster.phase(done), "Succeeded", ns.describe(name))
                first = cluster.first_stamped_line(ns, name, r"first step", 0)
                self.assertIsNotNone(first)
                times[label] = first - applied_at
        print("e2e user image: kubectl apply to the program's first line: %s" % ", ".join(
            "%s %.2f s" % item for item in times.items()))

    def test_the_program_sees_nothing_of_the_agents_loader(self):
        """Also with LD_PRELOAD set, as images that preload an allocator do: trixie's libstdc++
        needs glibc 2.38, and loaded into the agent (glibc 2.36) it would stop it before main;
        the agent's launcher keeps it from the agent's loader and the program gets it back."""
        preload = "/usr/lib/x86_64-linux-gnu/libstdc++.so.6"
        probe = ("import os\n"
                 "print('env', sorted(k + '=' + v for k, v in os.environ.items() "
                 "if k.startswith(('LD_', 'LOCKSTEP_IMAGE_'))))\n"
                 "print('maps', sorted({l.split()[-1] for l in open('/proc/self/maps') "
                 "if '/lockstep' in l}))\n"
                 "print('libc', sorted({l.split()[-1] for l in open('/proc/self/maps') "
                 "if 'libc.so' in l}))\n"
                 "print('image', os.environ.get('USE_LIBUV'), os.getcwd(), os.getuid())\n")
        with cluster.Namespace("agent-maps") as ns:
            job = exec_job("maps", ["python3", "-c", probe], image=cluster.USER_IMAGE,
                           template_spec={"securityContext": {"runAsUser": 1000}})
            job["spec"]["template"]["spec"]["containers"][0]["env"] = [
                {"name": "LD_PRELOAD", "value": preload}]
            ns.apply(job)
            done = ns.wait_job("maps", "finished", finished, timeout=180)
            self.assertEqual(cluster.phase(done), "Succeeded", ns.describe("maps"))
            logs = ns.logs(ns.pods("maps")[0]["metadata"]["name"])
            self.assertIn("[rank 0] env ['LD_PRELOAD=%s']" % preload, logs,
                          "the image's loader variables reach the program, and no others")
            self.assertIn("[rank 0] maps []", logs, "nothing under /lockstep is mapped")
            self.assertIn("[rank 0] libc ['/usr/lib/x86_64-linux-gnu/libc.so.6']", logs,
                          "the image's own C library")
            self.assertIn("[rank 0] image 0 /app 1000", logs,
                          "the image's environment and working directory, the template's user")

    def test_what_goes_wrong_names_the_pod_and_the_cause(self):
        # root's, 0755: the init container's user cannot write it
        blocked = "/tmp/lockstep-e2e-agent-volume"
        shutil.rmtree(blocked, ignore_errors=True)
        os.makedirs(blocked, mode=0o755)
        user = {"securityContext": {"runAsUser": 1000}}
        cases = {
            "not-in-image": (exec_job("not-in-image", ["python4", "train.py"],
                                      image=cluster.USER_IMAGE, template_spec=user),
                             r"pod not-in-image-worker-0 failed with exit code 127: .*command not "
                             r"found: python4 \(searched PATH=/usr/local/sbin:"),
            "no-shell": (exec_job("no-shell", ["sh", "-c", "echo hello"],
                                  image=cluster.NO_SHELL_IMAGE),
                         r"pod no-shell-worker-0 failed with exit code 127: .*command not found: "
                         r"sh "),
            "traceback": (exec_job("traceback", ["python3", "-c", "import torchvision"],
                                   image=cluster.USER_IMAGE, template_spec=user),
                          r"pod traceback-worker-0 failed with exit code 1: .*its last lines: "
                          r".*ModuleNotFoundError: No module named 'torchvision'"),
            "volume": (exec_job("volume", ["python3", "-c", "print(1)"], image=cluster.USER_IMAGE,
                                template_spec=dict(user, volumes=[{
                                    "name": "lockstep-agent",
                                    "hostPath": {"path": blocked, "type": "Directory"}}])),
                       r"pod volume-worker-0 failed with exit code 1: cannot install the Lockstep "
                       r"agent into the pod's volume \(/lockstep-volume\): .*Permission denied"),
        }
        try:
            with cluster.Namespace("agent-errors") as ns:
                for job, _ in cases.values():
                    ns.apply(job)
                # A program that needs no shell runs where there is none: the agent needs
                # nothing of the image.
                ns.apply(exec_job("busybox", ["/bin/busybox", "echo", "hello from busybox"],
                                  image=cluster.NO_SHELL_IMAGE))
                # A root image without a user for the restricted profile: the kubelet refuses it,
                # and the job says why.
                ns.apply(exec_job("as-root", ["python3", "-c", "print(1)"],
                                  image=cluster.USER_IMAGE))
                for name, (_, expected) in cases.items():
                    done = ns.wait_job(name, "failed", finished, timeout=180)
                    self.assertEqual(cluster.phase(done), "Failed", ns.describe(name))
                    failed = cluster.condition(done, "Failed") or {}
                    self.assertEqual(failed.get("reason"), "WorkersGaveUp", ns.describe(name))
                    self.assertRegex(failed.get("message", ""), expected)
                    print("e2e user image, %s: %s" % (name, failed["message"]))
                done = ns.wait_job("busybox", "finished", finished, timeout=180)
                self.assertEqual(cluster.phase(done), "Succeeded", ns.describe("busybox"))
                self.assertIn("[rank 0] hello from busybox",
                              ns.logs(ns.pods("busybox")[0]["metadata"]["name"]))
                stuck = ns.wait_job("as-root", "the reason it cannot start", lambda j: (
                    cluster.condition(j, "Running") or {}).get("reason") == "WorkerCannotStart",
                    timeout=180)
                self.assertRegex(cluster.condition(stuck, "Running")["message"],
                                 r"runAsNonRoot and image will run as root")

                # The image named twice, differently: refused, naming the field.
                twice = exec_job("twice", ["python3", "-c", "print(1)"], image=cluster.USER_IMAGE)
                twice["spec"]["image"] = "localhost/lockstep/other:dev"
                with self.assertRaises(AssertionError) as refused:
                    ns.apply(twice)
                self.assertIn("spec.template.spec.containers[0].image: names "
                              "localhost/lockstep/pytorch-example:dev but spec.image names "
                              "localhost/lockstep/other:dev", str(refused.exception))
        finally:
            shutil.rmtree(blocked, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
