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
        # Once the end is read (the channel's thread reads in its own time; asked earlier, the
        # helper rightly hands out generation 3, then still live).
        self.assertTrue(self.agent.wait_ended(3, timeout=10))
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


class FakeStore:
    """torch's TCPStore as the arrival wait uses it: add, set, and a get that blocks until its key
    exists or the store's timeout passes (then RuntimeError, as torch's DistStoreError). Records
    each call by its caller's thread name."""

    def __init__(self, broken=None, timeout_s=10):
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._values = {}
        self._set = set()  # keys a get may see: only set() wakes a get (torch 1.13's add does not)
        self.calls = []
        self._broken = broken  # an error every call raises: a store whose server is gone

    def _call(self, *call):
        self.calls.append((threading.current_thread().name,) + call)
        self._cond.notify_all()
        if self._broken is not None:
            raise self._broken

    def add(self, key, delta):
        with self._cond:
            self._call("add", key, delta)
            self._values[key] = int(self._values.get(key, 0)) + delta
            return self._values[key]

    def set(self, key, value):
        with self._cond:
            self._call("set", key, value)
            self._values[key] = value.encode()
            self._set.add(key)
            self._cond.notify_all()

    def get(self, key):
        """Blocks until the key exists, within the store's timeout, as torch's get does."""
        with self._cond:
            self._call("get", key)
            if not self._cond.wait_for(lambda: key in self._set, self.timeout_s):
                raise RuntimeError(f"wait timeout after {self.timeout_s * 1000:g}ms, keys: {key}")
            return self._values[key]

    def wait_for_waiters(self, names, timeout_s):
        """True once every thread named has called get."""
        with self._cond:
            return self._cond.wait_for(
                lambda: names <= {c[0] for c in self.calls if c[1] == "get"}, timeout_s)


class FakePrefixStore:
    """torch's PrefixStore: every key under "prefix/"."""

    def __init__(self, prefix, store):
        self._prefix, self._store = prefix, store

    def add(self, key, delta):
        return self._store.add(f"{self._prefix}/{key}", delta)

    def set(self, key, value):
        self._store.set(f"{self._prefix}/{key}", value)

    def get(self, key):
        return self._store.get(f"{self._prefix}/{key}")



class FakeAgent:
    def __init__(self):
        self.over = threading.Event()
        self.closed = False

    def wait_ended(self, generation, timeout):
        return self.over.wait(timeout)


class ArrivalTest(unittest.TestCase):
    """How the members of a generation wait for each other at rank 0's store before forming the
    group (elastic._wait_for_everyone): blocked in the store, not polling it."""

    def setUp(self):
        self.store = FakeStore()
        self.agent = FakeAgent()
        self.errors = {}

    def over(self):
        if self.agent.over.is_set():
            raise elastic.GenerationEnded("generation 1 is over")

    def member(self, world, timeout_s=10):
        name = threading.current_thread().name
        try:
            elastic._wait_for_everyone(FakePrefixStore("lockstep/1", self.store), world,
                                       self.over, timeout_s, "generation 1, store h:1")
        except Exception as error:  # noqa: BLE001 - checked by the test
            self.errors[name] = error

    def start(self, names, world):
        threads = [threading.Thread(target=self.member, args=(world,), name=n) for n in names]
        for thread in threads:
            thread.start()
        return threads

    def join(self, threads):
        for thread in threads:
            thread.join(10)
            self.assertFalse(thread.is_alive())

    def test_waiting_members_block_in_the_store_until_the_last_arrives(self):
        waiters = self.start(["rank1", "rank2"], 3)
        self.assertTrue(self.store.wait_for_waiters({"rank1", "rank2"}, 10))
        self.join(waiters + self.start(["rank0"], 3))
        self.assertEqual(self.errors, {})
        # Two requests each, however long the wait.
        for name in ("rank1", "rank2"):
            self.assertEqual([c[1:] for c in self.store.calls if c[0] == name], [
                ("add", "lockstep/1/arrived", 1), ("get", "lockstep/1/everyone")])
        self.assertEqual([c[1:] for c in self.store.calls if c[0] == "rank0"], [
            ("add", "lockstep/1/arrived", 1), ("set", "lockstep/1/everyone", "1")])

    def test_a_generation_that_ends_while_its_members_gather_wakes_them_into_generation_ended(self):
        self.store.timeout_s = 600  # only the watch can end the gets within the test's wait
        waiters = self.start(["rank1", "rank2"], 3)
        self.assertTrue(self.store.wait_for_waiters({"rank1", "rank2"}, 10))
        gathered = threading.Event()
        watch = threading.Thread(target=elastic._end_arrivals, name="watch",
                                 args=(lambda: self.store, 1, 3, self.agent, gathered))
        watch.start()
        self.agent.over.set()
        self.join(waiters + [watch])
        self.assertIn(("watch", "set", "lockstep/1/everyone", "ended"), self.store.calls)
        for name in ("rank1", "rank2"):
            self.assertIsInstance(self.errors.get(name), elastic.GenerationEnded, name)

    def test_the_last_member_after_the_generations_end_does_not_go_on_alone(self):
        waiters = self.start(["rank1"], 2)
        self.assertTrue(self.store.wait_for_waiters({"rank1"}, 10))
        self.agent.over.set()
        elastic._end_arrivals(lambda: self.store, 1, 2, self.agent, threading.Event())
        self.agent.over.clear()  # the last member's agent has not heard yet
        self.join(waiters + self.start(["rank0"], 2))
        self.assertIsInstance(self.errors.get("rank0"), elastic.GenerationEnded)
        self.assertIsInstance(self.errors.get("rank1"), elastic.GenerationEnded)
        self.assertFalse([c for c in self.store.calls if c[0] == "rank0" and c[1] == "set"])

    def test_a_generations_end_after_everyone_arrived_changes_nothing(self):
        self.join(self.start(["rank1", "rank0"], 2))
        self.assertEqual(self.errors, {})
        self.agent.over.set()
        elastic._end_arrivals(lambda: self.store, 1, 2, self.agent, threading.Event())
        self.assertEqual(self.store.get("lockstep/1/everyone"), b"1")

    def test_the_watch_ends_when_the_agent_is_gone(self):
        self.agent.closed = True
        watch = threading.Thread(target=elastic._end_arrivals,
                                 args=(lambda: self.store, 1, 2, self.agent, threading.Event()))
        watch.start()
        watch.join(10)
        self.assertFalse(watch.is_alive())
        self.assertEqual(self.store.calls, [])

    def test_rank0_sets_nothing_once_its_members_have_gathered(self):
        gathered = threading.Event()
        gathered.set()
        connected = []
        elastic._end_arrivals(lambda: connected.append(1), 1, 2, self.agent, gathered)
        self.assertEqual(connected, [])

    def test_a_member_that_never_comes_ends_the_wait_at_its_deadline_naming_the_store(self):
        elastic_error = None
        try:
            elastic._wait_for_everyone(FakePrefixStore("lockstep/4", FakeStore(timeout_s=0.2)),
                                       2, self.over, 0.2, "generation 4, store h:1")
        except RuntimeError as error:
            elastic_error = error
        self.assertRegex(str(elastic_error),
                         r"generation 4, store h:1: not every member reached the store within "
                         r"0.2 s \(wait timeout")

    def test_a_store_whose_server_is_gone_is_an_error_naming_it_or_the_generations_end(self):
        broken = FakeStore(broken=RuntimeError("Connection reset by peer"))
        with self.assertRaisesRegex(RuntimeError, r"store h:1: .*Connection reset by peer"):
            elastic._wait_for_everyone(broken, 2, lambda: None, 60, "generation 1, store h:1")
        self.agent.over.set()
        with self.assertRaises(elastic.GenerationEnded):
            elastic._wait_for_everyone(broken, 2, self.over, 60, "generation 1, store h:1")


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
