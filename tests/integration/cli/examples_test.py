"""Every example says where it runs and what it needs, and the ones that run on one machine do.

Each manifest under examples/ opens with three comment lines:
    # Runs: local, cluster, GPU        (some of these)
    # Needs: what must be there first
    # Proven: what has run it, and where
Every TrainingJob whose `Runs:` names `local` is run here with `lockstep run`, cut to a few
steps, from a copy in a scratch directory (so relative data paths, checkpoints and logs stay
there); it must end with exit 0 and, for the built-in trainer, at exactly its steps. The e2e tests
a `Proven:` line names must exist.

Usage: examples_test.py --lockstep BIN --click-log BIN --source DIR
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

import yaml

PLACES = {"local", "cluster", "GPU"}
STEPS = 30            # built-in trainer's steps in a shortened run
EXEC_STEPS = "6"      # a PyTorch example's --steps
RUN_TIMEOUT_S = 300   # one shortened run, on a loaded 2-core machine

OPTIONS = None


def header(path):
    """The example's leading comment block as {field: text}, continuation lines joined."""
    fields, current = {}, None
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("#"):
                break
            text = line[1:].strip()
            match = re.match(r"(Runs|Needs|Proven): (.*)", text)
            if match:
                current = match.group(1)
                fields[current] = match.group(2)
            elif current and line.startswith("#   "):
                fields[current] += " " + text
            else:
                current = None
    return fields


def places(fields):
    """The set of places a header's `Runs:` line names."""
    return {p.strip() for p in fields.get("Runs", "").split(",")}


def example_paths():
    source = OPTIONS.source
    return sorted(glob.glob(os.path.join(source, "examples", "*.yaml")) +
                  glob.glob(os.path.join(source, "examples", "kueue", "*.yaml")))


def shortened(manifest, scratch):
    """The manifest cut to a short run whose files stay under `scratch`."""
    spec = manifest["spec"]
    trainer = spec.get("trainer")
    if trainer is not None:
        trainer.pop("epochs", None)
        trainer["steps"] = STEPS
        trainer["logIntervalSteps"] = 10
    command = spec.get("command")
    if command is not None:
        for flag, value in (("--steps", EXEC_STEPS),
                            ("--checkpoint", os.path.join(scratch, "ckpt", "ckpt.pt"))):
            if flag in command:
                command[command.index(flag) + 1] = value
    if "checkpoint" in spec:
        spec["checkpoint"]["uri"] = "file://" + os.path.join(scratch, "ckpt")
    spec["metrics"] = {"port": 0}
    return manifest


class ExamplesTest(unittest.TestCase):
    def test_every_example_says_where_it_runs_what_it_needs_and_what_proved_it(self):
        paths = example_paths()
        self.assertGreaterEqual(len(paths), 10, "examples/ lost its manifests")
        e2e_dir = os.path.join(OPTIONS.source, "tests", "e2e")
        for path in paths:
            with self.subTest(example=os.path.relpath(path, OPTIONS.source)):
                fields = header(path)
                for field in ("Runs", "Needs", "Proven"):
                    self.assertIn(field, fields, "%s: no '# %s:' line at the top" % (path, field))
                self.assertTrue(places(fields) <= PLACES,
                                "%s: Runs: %r is not a list of %s" % (path, fields["Runs"],
                                                                       sorted(PLACES)))
                for test in re.findall(r"\be2e_([a-z_]+)", fields["Proven"]):
                    self.assertTrue(os.path.exists(os.path.join(e2e_dir, "test_%s.py" % test)),
                                    "%s: Proven names e2e_%s, which does not exist" % (path, test))

    def test_every_example_that_runs_locally_runs_with_lockstep_run(self):
        ran = []
        for path in example_paths():
            with open(path, encoding="utf-8") as f:
                documents = [d for d in yaml.safe_load_all(f) if d]  # examples/kueue: several
            if len(documents) != 1 or documents[0].get("kind") != "TrainingJob":
                continue
            manifest = documents[0]
            if "local" not in places(header(path)):
                continue
            name = os.path.basename(path)
            with self.subTest(example=name), tempfile.TemporaryDirectory() as scratch:
                if name == "click-log.yaml":
                    subprocess.run([OPTIONS.click_log, "--samples", "4000", "--test-samples",
                                    "500", os.path.join(scratch, "data", "click-log")],
                                   check=True, stdout=subprocess.DEVNULL, timeout=120)
                copy = os.path.join(scratch, name)
                with open(copy, "w", encoding="utf-8") as f:
                    yaml.safe_dump(shortened(manifest, scratch), f)
                summary = os.path.join(scratch, "summary.json")
                result = subprocess.run(
                    [OPTIONS.lockstep, "run", copy, "--summary", summary,
                     "--log-dir", os.path.join(scratch, "logs")],
                    cwd=OPTIONS.source, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)
                self.assertEqual(result.returncode, 0,
                                 "%s as documented (`lockstep run`, cut short) failed:\n%s%s"
                                 % (name, result.stdout[-3000:], result.stderr[-3000:]))
                if "trainer" in manifest["spec"]:
                    with open(summary, encoding="utf-8") as f:
                        self.assertEqual(json.load(f)["steps"], STEPS, name)
                ran.append(name)
                print("%s: ran to its end as documented, cut short" % name)
        # The examples a user runs first are among them (a header that lost `local` would
        # silently skip its example otherwise).
        for name in ("fashion-mnist.yaml", "digits.yaml", "pytorch-ddp.yaml", "click-log.yaml"):
            self.assertIn(name, ran)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lockstep", required=True)
    parser.add_argument("--click-log", required=True)
    parser.add_argument("--source", required=True)
    OPTIONS, rest = parser.parse_known_args()
    unittest.main(argv=[sys.argv[0]] + rest)
