"""The zygote's side of a fork the agent gives up on (python/lockstep/zygote.py), driven over its
real protocol: a spare that is not told to go runs nothing of the script."""
import ctypes
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
WAIT_S = 20
PR_SET_CHILD_SUBREAPER = 36


class ZygoteProtocolTest(unittest.TestCase):
    def setUp(self):
        # The spares are reparented to this process, as to the agent (a child subreaper).
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        self.dir = tempfile.mkdtemp(prefix="zygote-test-")
        self.script = os.path.join(self.dir, "main.py")
        with open(self.script, "w") as f:
            f.write("open(__file__ + '.ran', 'w').close()\n")
        agent_end, zygote_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.agent = agent_end
        env = dict(os.environ, PYTHONPATH=HELPERS, LOCKSTEP_EXEC_PRELOAD="json",
                   LOCKSTEP_ZYGOTE_FD=str(zygote_end.fileno()))
        self.zygote = subprocess.Popen(
            [sys.executable, "-m", "lockstep.zygote", "--", self.script], env=env,
            pass_fds=[zygote_end.fileno()])
        zygote_end.close()
        self.agent.settimeout(WAIT_S)
        ready = json.loads(self.agent.recv(65536))
        self.assertTrue(ready["ready"])
        self.assertFalse(ready["elastic"], "the script never imports lockstep.elastic")

    def tearDown(self):
        self.agent.close()  # the zygote exits at end-of-file
        self.zygote.wait(timeout=WAIT_S)
        ctypes.CDLL(None).prctl(PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def fork(self, go):
        """Asks for a spare; go=True writes its go byte, False closes the pipe unwritten."""
        out_r, out_w = os.pipe()
        channel_agent, channel_spare = socket.socketpair()
        go_r, go_w = os.pipe()
        env = b"PATH=/usr/bin:/bin\0PYTHONPATH=" + HELPERS.encode() + b"\0"
        socket.send_fds(self.agent, [env], [out_w, out_w, channel_spare.fileno(), go_r])
        for fd in (out_w, go_r):
            os.close(fd)
        channel_spare.close()
        pid = json.loads(self.agent.recv(65536))["pid"]
        if go:
            os.write(go_w, b"g")
        os.close(go_w)
        deadline = time.monotonic() + WAIT_S
        status = None
        while status is None and time.monotonic() < deadline:
            reaped, code = os.waitpid(pid, os.WNOHANG)  # our child, as the agent's
            status = os.waitstatus_to_exitcode(code) if reaped else None
            time.sleep(0.01)
        os.close(out_r)
        channel_agent.close()
        self.assertIsNotNone(status, "the spare did not end")
        return status, os.path.exists(self.script + ".ran")

    def test_a_spare_told_to_go_runs_the_script(self):
        self.assertEqual(self.fork(go=True), (0, True))

    def test_a_spare_whose_fork_the_agent_gave_up_on_runs_nothing(self):
        self.assertEqual(self.fork(go=False), (127, False))
        self.assertIsNone(self.zygote.poll(), "the zygote serves on")

    def test_a_spare_forked_ahead_of_its_place_runs_its_start_up_and_stops_at_its_rank(self):
        with open(self.script, "w") as f:
            f.write("import os\nopen(__file__ + '.ran', 'w').close()\n"
                    "rank = os.environ['RANK']\nopen(__file__ + '.asked', 'w').close()\n")
        out_r, out_w = os.pipe()
        channel_agent, channel_spare = socket.socketpair()
        go_r, go_w = os.pipe()
        env = (b"PATH=/usr/bin:/bin\0PYTHONPATH=" + HELPERS.encode() +
               b"\0LOCKSTEP_AWAIT_IDENTITY=RANK,WORLD_SIZE\0")
        socket.send_fds(self.agent, [env], [out_w, out_w, channel_spare.fileno(), go_r])
        for fd in (out_w, go_r):
            os.close(fd)
        channel_spare.close()
        pid = json.loads(self.agent.recv(65536))["pid"]
        os.write(go_w, b"g")
        os.close(go_w)
        channel_agent.settimeout(WAIT_S)
        self.assertEqual(json.loads(channel_agent.recv(65536)),
                         {"type": "awaiting", "variable": "RANK"})
        self.assertTrue(os.path.exists(self.script + ".ran"), "the start-up ran")
        self.assertFalse(os.path.exists(self.script + ".asked"), "nothing after the rank's read")
        channel_agent.close()  # the agent ends it (or is gone): it exits 0, having run no place
        deadline = time.monotonic() + WAIT_S
        status = None
        while status is None and time.monotonic() < deadline:
            reaped, code = os.waitpid(pid, os.WNOHANG)
            status = os.waitstatus_to_exitcode(code) if reaped else None
            time.sleep(0.01)
        os.close(out_r)
        self.assertEqual(status, 0)
        self.assertFalse(os.path.exists(self.script + ".asked"))


class ScriptImportsTest(unittest.TestCase):
    """What the zygote tells the agent of the script: whether it imports lockstep.elastic, the
    precondition for forking it ahead of a place."""

    def waits_in_helper(self, text):
        sys.path.insert(0, HELPERS)
        try:
            from lockstep import zygote
        finally:
            sys.path.remove(HELPERS)
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(text)
        try:
            return zygote.waits_in_helper(zygote.script_imports(zygote.Launch([f.name])))
        finally:
            os.unlink(f.name)

    def test_a_script_that_imports_the_elastic_helper_may_wait_in_it(self):
        for text in ["from lockstep import elastic\n", "import lockstep.elastic as e\n",
                     "def main():\n    from lockstep.elastic import run\n"]:
            self.assertTrue(self.waits_in_helper(text), text)

    def test_other_scripts_and_unreadable_ones_may_not(self):
        for text in ["import torch\n", "from lockstep import progress\n", "import lockstep\n",
                     "this is not python(\n"]:
            self.assertFalse(self.waits_in_helper(text), text)


if __name__ == "__main__":
    unittest.main()
