"""A program forked ahead of its place (python/lockstep/identity.py), as a real interpreter with the
guard installed the way the zygote installs it, and the test in the agent's place on the helper
channel: what the program may do before it has a rank, and what happens when it asks for it."""
import json
import os
import select
import socket
import subprocess
import sys
import textwrap
import unittest

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
WAIT_S = 20
AWAITED = "RANK,WORLD_SIZE,MASTER_ADDR,MASTER_PORT,LOCAL_RANK"


class ProgramAheadOfItsPlace:
    """`body` run in a child interpreter after identity.install; the test holds the agent's end."""

    def __init__(self, body):
        self.agent, program_end = socket.socketpair()
        prologue = textwrap.dedent(f"""
            import os, sys, threading
            from lockstep import identity
            identity.install({AWAITED!r}.split(","), {program_end.fileno()})
            """)
        env = dict(os.environ, PYTHONPATH=HELPERS, PYTHONUNBUFFERED="1", HOME="/home/ahead",
                   LOCKSTEP_AGENT_FD=str(program_end.fileno()))
        for name in AWAITED.split(","):
            env.pop(name, None)
        self.process = subprocess.Popen([sys.executable, "-c", prologue + textwrap.dedent(body)],
                                        env=env, pass_fds=[program_end.fileno()],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        program_end.close()
        self.agent.settimeout(WAIT_S)

    def read_until(self, text):
        """The program's output up to and including `text` (fails after WAIT_S)."""
        out = b""
        while text.encode() not in out:
            ready, _, _ = select.select([self.process.stdout], [], [], WAIT_S)
            chunk = os.read(self.process.stdout.fileno(), 4096) if ready else b""
            if not chunk:
                raise AssertionError(f"no {text!r} from the program; it said: {out.decode()}")
            out += chunk
        return out.decode()

    def message(self):
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.agent.recv(65536)
            if not chunk:
                raise AssertionError("the program closed its channel")
            line += chunk
        return json.loads(line)

    def end(self):
        """Closes the agent's end and returns (exit status, what the program printed last)."""
        self.agent.close()
        rest, _ = self.process.communicate(timeout=WAIT_S)
        return self.process.returncode, rest.decode()


def assignment(**env):
    return (json.dumps({"type": "assign", "generation": 2, "rank": 3, "world_size": 4,
                        "master_addr": "10.0.0.1", "master_port": 29500, "restart_count": 0,
                        "env": env}) + "\n").encode()


class ProgramAheadOfItsPlaceTest(unittest.TestCase):
    def test_start_up_that_reads_no_rank_runs_to_its_end(self):
        program = ProgramAheadOfItsPlace("""
            print("home", os.environ["HOME"], os.getenv("RANK_LIKE", "-"), flush=True)
            print("done", flush=True)
            """)
        self.assertIn("home /home/ahead -\ndone", program.read_until("done"))
        self.assertEqual(program.end()[0], 0)

    def test_a_rank_read_before_the_helper_tells_the_agent_and_goes_no_further(self):
        for read, variable in [('os.environ["RANK"]', "RANK"),
                               ('os.getenv("WORLD_SIZE")', "WORLD_SIZE"),
                               ('"MASTER_ADDR" in os.environ', "MASTER_ADDR"),
                               ('os.environ.setdefault("MASTER_PORT", "1")', "MASTER_PORT"),
                               ('os.environ.__setitem__("LOCAL_RANK", "0")', "LOCAL_RANK"),
                               ("dict(os.environ)", "the environment"),
                               ("environ_taken_early.get('RANK')", "RANK")]:
            with self.subTest(read=read):
                program = ProgramAheadOfItsPlace(f"""
                    from os import environ as environ_taken_early
                    print("before", flush=True)
                    value = {read}
                    print("after", value, flush=True)
                    """)
                program.read_until("before")
                message = program.message()
                self.assertEqual((message["type"], message["variable"]), ("awaiting", variable))
                status, rest = program.end()
                self.assertEqual(status, 0, "a program never given a place exits 0")
                self.assertNotIn("after", rest)

    def test_in_the_helper_a_rank_read_waits_for_the_assignment_and_sees_it(self):
        # What elastic.run() does with its channel before it forms the group: takes the newest
        # assignment of a generation not over and applies its variables.
        program = ProgramAheadOfItsPlace("""
            from lockstep import elastic
            agent = elastic._Agent(int(os.environ["LOCKSTEP_AGENT_FD"]))
            seen = []
            reader = threading.Thread(target=lambda: seen.append(os.environ["RANK"]))
            reader.start()
            print("waiting", identity.awaiting(), flush=True)
            identity.apply(agent.next_assignment()["env"])
            reader.join()
            print("rank", seen[0], os.environ["MASTER_ADDR"], identity.awaiting(),
                  type(os.environ).__name__, flush=True)
            """)
        program.read_until("waiting True")
        program.agent.sendall(assignment(RANK="3", MASTER_ADDR="10.0.0.1"))
        self.assertIn("rank 3 10.0.0.1 False _Environ", program.read_until("_Environ"))
        self.assertEqual(program.end()[0], 0)

    def test_the_helpers_own_thread_reading_its_rank_early_is_an_error_not_a_hang(self):
        program = ProgramAheadOfItsPlace("""
            from lockstep import elastic
            agent = elastic._Agent(int(os.environ["LOCKSTEP_AGENT_FD"]))
            try:
                os.environ["RANK"]
            except RuntimeError as error:
                print("refused:", error, flush=True)
            """)
        self.assertIn("refused: lockstep: RANK read in elastic.run()'s thread",
                      program.read_until("?)"))
        self.assertEqual(program.end()[0], 0)

    def test_forking_before_the_helper_counts_as_asking(self):
        program = ProgramAheadOfItsPlace("""
            print("before", flush=True)
            if os.fork() == 0:
                os._exit(0)
            print("after", flush=True)
            """)
        program.read_until("before")
        self.assertEqual(program.message(), {"type": "awaiting", "variable": "a new process (fork)"})
        status, rest = program.end()
        self.assertEqual(status, 0)
        self.assertNotIn("after", rest)

    def test_in_the_helper_a_place_that_never_comes_ends_the_program_with_0(self):
        program = ProgramAheadOfItsPlace("""
            from lockstep import elastic
            agent = elastic._Agent(int(os.environ["LOCKSTEP_AGENT_FD"]))
            reader = threading.Thread(target=lambda: print(os.environ["RANK"]))
            reader.start()
            print("waiting", flush=True)
            reader.join()
            """)
        program.read_until("waiting")
        status, rest = program.end()
        self.assertEqual((status, rest.strip()), (0, ""))


if __name__ == "__main__":
    unittest.main()
