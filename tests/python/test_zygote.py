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
        self.assertTrue(json.loads(self.agent.recv(65536))["ready"])

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


if __name__ == "__main__":
    unittest.main()
