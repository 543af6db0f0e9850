"""lockstep.elastic, the helper that lets a PyTorch program recover in place.

Run by CTest with /usr/bin/python3 (tests/CMakeLists.txt). The agent's side of the channel is
tested in tests/worker/agent/helper_channel_test.cc; recovery end to end, with real processes
killed, in tests/integration/exec/in_place_recovery_test.cc.
"""
import json
import os
import socket
import sys
import tempfile
import threading
import unittest

HELPERS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python")
sys.path.insert(0, HELPERS)

from lockstep import elastic  # noqa: E402

try:
    import torch
except ImportError:  # the State tests need torch's save/load
    torch = None


class Counter:
    def __init__(self, value=0):
        self.value = value

    def state_dict(self):
        return {"value": self.value}

    def load_state_dict(self, saved):
        self.value = saved["value"]


class StateTest(unittest.TestCase):
    def test_objects_without_state_dict_are_refused_by_name(self):
        with self.assertRaisesRegex(TypeError, "model"):
            elastic.State(model=object())

    def test_a_negative_step_is_refused(self):
        with self.assertRaisesRegex(ValueError, "step"):
            elastic.State(step=-1)

    def test_objects_are_reachable_by_name(self):
        counter = Counter()
        self.assertIs(elastic.State(counter=counter).counter, counter)

    @unittest.skipIf(torch is None, "no torch")
    def test_a_state_travels_through_bytes_whole(self):
        source = elastic.State(step=7, counter=Counter(41))
        source.extra["seed"] = 3
        target = elastic.State(counter=Counter())
        target._load_bytes(source._to_bytes())
        self.assertEqual((target.step, target.counter.value, target.extra), (7, 41, {"seed": 3}))

    def test_steps_count_a_step_once_its_body_is_done(self):
        state = elastic.State(step=2)
        ctx = elastic.Context.__new__(elastic.Context)
        ctx.state, ctx.generation, ctx._agent, ctx._snapshot = state, 1, None, None
        seen = []
        for step in ctx.steps(5):
            seen.append((step, state.step))
        self.assertEqual(seen, [(2, 2), (3, 3), (4, 4)])
        self.assertEqual(state.step, 5)


class AgentChannelTest(unittest.TestCase):
    def setUp(self):
        self.agent_end, program_end = socket.socketpair()
        self.agent = elastic._Agent(program_end.detach())

    def tearDown(self):
        self.agent_end.close()

    def send(self, **message):
        self.agent_end.sendall((json.dumps(message) + "\n").encode())

    def test_hello_reaches_the_agent_as_one_json_line(self):
        self.agent.send(type="hello", protocol=elastic.PROTOCOL, pid=os.getpid())
        line = self.agent_end.makefile().readline()
        self.assertEqual(json.loads(line)["type"], "hello")

    def test_an_assignment_of_a_generation_already_over_is_skipped(self):
        self.send(type="assign", generation=3, rank=0, world_size=2)
        self.send(type="ended", generation=3)
        self.send(type="assign", generation=4, rank=1, world_size=2)
        self.assertEqual(self.agent.next_assignment()["generation"], 4)

    def test_the_end_of_a_generation_is_seen_and_waited_for(self):
        self.assertFalse(self.agent.ended(2))
        threading.Timer(0.05, lambda: self.send(type="ended", generation=2)).start()
        self.assertTrue(self.agent.wait_ended(2, timeout=10))
        self.assertTrue(self.agent.ended(1))

    def test_waiting_for_an_end_that_never_comes_is_bounded(self):
        self.assertFalse(self.agent.wait_ended(5, timeout=0.05))

    def test_a_gone_agent_ends_the_wait_for_an_assignment(self):
        self.agent_end.close()
        self.assertIsNone(self.agent.next_assignment())


class SnapshotTest(unittest.TestCase):
    @unittest.skipIf(torch is None, "no torch")
    def test_a_cold_process_resumes_from_a_newer_snapshot_only(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "state.snapshot")
            snapshot = elastic._Snapshot(path, every_seconds=0)
            snapshot.save(elastic.State(step=30, counter=Counter(9)))
            fresh = elastic.State(counter=Counter())
            self.assertTrue(snapshot.restore_into(fresh))
            self.assertEqual((fresh.step, fresh.counter.value), (30, 9))
            newer = elastic.State(step=40, counter=Counter(1))
            self.assertFalse(snapshot.restore_into(newer))
            self.assertEqual(newer.counter.value, 1)


if __name__ == "__main__":
    unittest.main()
