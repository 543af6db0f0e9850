"""In-place recovery for PyTorch programs run by Lockstep's exec agent.

A program that hands its training function and its state to run() survives a peer's failure
without exiting: when a process of the job dies, the surviving processes stay alive, leave the
broken process group, join the next generation through their agents, form a new group with the
new ranks and go on from the state they hold in memory. Only the failed process is replaced, by a
warm spare its agent started ahead of time (imports done, waiting in run()), and it receives the
state from a survivor, not from storage.

    import torch
    from torch.nn.parallel import DistributedDataParallel
    from lockstep import elastic

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    state = elastic.State(model=model, optimizer=optimizer)   # plus state.step, state.extra

    def train(ctx):                        # called once per generation
        ddp = DistributedDataParallel(model, process_group=ctx.group)
        for step in ctx.steps(total_steps):   # from state.step; counts the step when it is done
            ...forward, backward, optimizer.step() on this rank's share of the step's batch...

    elastic.run(train, state)

The rules that make this exact:

  * Everything that holds the process group (the DistributedDataParallel wrapper) is created
    inside train() and not kept elsewhere: when a collective fails, run() drops the group, and
    the connections close only once nothing refers to it, which is what tells the peers still
    waiting in a collective that this generation is over.
  * One iteration of ctx.steps() is one optimizer step and nothing after optimizer.step() in the
    iteration talks to other ranks: a step either completes everywhere it was counted or is
    trained again from the state before it.
  * The data of step s depends on s (and the rank and world size ctx gives), not on how many
    steps this process has run.
  * A failed step is not rolled back: what its forward pass changed before the failure (the
    running statistics of BatchNorm, the RNG dropout draws from) stays changed on the ranks that
    got that far. Models whose step has such side effects recover approximately, not exactly;
    keep an RNG state in `state.extra` and restore it per step where that matters.
  * With nccl, a collective that hangs on a lost peer cannot be aborted from Python (torch
    1.13's gloo and nccl have no abort): a survivor stuck in one is stopped by its agent after
    the grace period and restarted, and receives the state from a survivor that left in time.

At the start of each generation the ranks agree on the state: the rank holding the newest one
(highest state.step; a state a survivor trained in memory before one restored from a copy; then
the lowest rank) sends it to the others unless every rank already holds it. A process started
cold (every rank failed at once, the pod survived) first reads the copy of its state that run()
keeps in the agent's host memory (LOCKSTEP_STATE_SNAPSHOT, written every `snapshot_seconds`),
so it resumes from there rather than from the program's last checkpoint.

Outside Lockstep (no LOCKSTEP_AGENT_FD: torchrun or plain python) run() forms the group from
the environment (init_method="env://"), agrees on the state the same way, calls train() once and
lets a failure end the program, as any PyTorch program: the same script runs in both places.
"""
import datetime
import gc
import io
import json
import os
import socket
import threading
import time
import traceback

from . import identity

__all__ = ["State", "Context", "run", "GenerationEnded"]

AGENT_FD = "LOCKSTEP_AGENT_FD"
SNAPSHOT_FILE = "LOCKSTEP_STATE_SNAPSHOT"
WARM_SPARE = "LOCKSTEP_WARM_SPARE"
# How long a process whose collective failed waits for its agent to say that the generation is
# over before it takes the error for the program's own and raises it.
CONFIRM_SECONDS = "LOCKSTEP_ELASTIC_CONFIRM_SECONDS"
PROTOCOL = 1
# A line from the agent longer than this is a protocol error (the agent's lines are small).
_MAX_LINE_BYTES = 1 << 20


class GenerationEnded(Exception):
    """Raised by Context.steps() at a step boundary when the agent says the generation is over
    (a member joined or left); run() catches it and goes on in the next generation."""


class State:
    """What a process must hold to go on training: named objects with state_dict() and
    load_state_dict() (modules, optimizers, schedulers, gradient scalers), the step count, and
    `extra`, a dict of picklable values (e.g. an RNG state) that travels with them."""

    def __init__(self, step=0, **objects):
        for name, obj in objects.items():
            if not (callable(getattr(obj, "state_dict", None)) and
                    callable(getattr(obj, "load_state_dict", None))):
                raise TypeError(f"State({name}=...): {type(obj).__name__} has no "
                                "state_dict()/load_state_dict()")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"State(step=...) must be an integer >= 0, got {step!r}")
        self.step = step
        self.extra = {}
        self._objects = dict(objects)
        # True while this process holds the state its group trained (not a fresh or restored one).
        self._live = False

    def __getattr__(self, name):
        objects = self.__dict__.get("_objects", {})
        if name in objects:
            return objects[name]
        raise AttributeError(name)

    def state_dict(self):
        return {"step": self.step, "extra": self.extra,
                "objects": {name: obj.state_dict() for name, obj in self._objects.items()}}

    def load_state_dict(self, saved):
        missing = set(self._objects) - set(saved["objects"])
        if missing:
            raise KeyError(f"the saved state has no {', '.join(sorted(missing))}")
        for name, obj in self._objects.items():
            obj.load_state_dict(saved["objects"][name])
        self.step = saved["step"]
        self.extra = saved["extra"]

    def _to_bytes(self):
        import torch
        buffer = io.BytesIO()
        torch.save(self.state_dict(), buffer)
        return buffer.getvalue()

    def _load_bytes(self, data):
        import torch
        self.load_state_dict(torch.load(io.BytesIO(data), map_location="cpu"))


class Context:
    """One generation as the training function sees it."""

    def __init__(self, state, rank, world_size, local_rank, generation, restart_count, agent,
                 snapshot):
        import torch.distributed as dist
        self.state = state
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.generation = generation
        self.restart_count = restart_count
        self.group = dist.group.WORLD
        self._agent = agent
        self._snapshot = snapshot

    def steps(self, total):
        """Yields state.step, state.step + 1, ..., total - 1. A step counts (state.step advances)
        when the loop asks for the next one; before each step, raises GenerationEnded if the agent
        said the generation is over."""
        if isinstance(total, bool) or not isinstance(total, int) or total < 0:
            raise ValueError(f"steps(total=...) must be an integer >= 0, got {total!r}")
        while self.state.step < total:
            if self._agent is not None and self._agent.ended(self.generation):
                raise GenerationEnded(f"generation {self.generation} is over")
            yield self.state.step
            self.state.step += 1
            if self._snapshot is not None:
                self._snapshot.maybe_save(self.state)


class _Agent:
    """The helper's end of the agent's channel (worker/agent/helper_channel.h has the protocol)."""

    def __init__(self, fd):
        os.set_inheritable(fd, False)  # not for the program's own subprocesses
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM, fileno=fd)
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._assignments = []
        self._ended = 0
        self._closed = False
        # A process forked ahead of its place: a thread that reads its rank before run() has an
        # assignment waits for it.
        identity.helper_started()
        threading.Thread(target=self._read, name="lockstep-agent", daemon=True).start()

    @classmethod
    def from_environment(cls):
        value = os.environ.get(AGENT_FD, "")
        if not value:
            return None
        try:
            fd = int(value)
            os.fstat(fd)
        except (ValueError, OSError) as error:
            raise RuntimeError(f"{AGENT_FD}={value!r} is not an open descriptor: {error}") from None
        return cls(fd)

    def _read(self):
        pending = b""
        try:
            while True:
                chunk = self._socket.recv(65536)
                if not chunk:
                    break
                pending += chunk
                *lines, pending = pending.split(b"\n")
                if len(pending) > _MAX_LINE_BYTES:
                    break
                for line in lines:
                    message = json.loads(line)
                    if not isinstance(message, dict):
                        raise ValueError("not a JSON object")
                    with self._cond:
                        if message.get("type") == "assign":
                            self._assignments.append(message)
                        elif message.get("type") == "ended":
                            self._ended = max(self._ended, int(message["generation"]))
                        self._cond.notify_all()
        except Exception:  # noqa: BLE001 - a broken channel is a gone agent
            pass
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        identity.helper_gone()

    def send(self, **message):
        line = (json.dumps(message) + "\n").encode()
        with self._send_lock:
            try:
                self._socket.sendall(line)
            except OSError:
                pass  # the agent is gone; it ends this process too

    def ended(self, generation):
        with self._cond:
            return self._ended >= generation

    @property
    def closed(self):
        """The channel to the agent is gone: no end of a generation will be told any more."""
        with self._cond:
            return self._closed

    def wait_ended(self, generation, timeout):
        with self._cond:
            return self._cond.wait_for(lambda: self._ended >= generation or self._closed, timeout) \
                and self._ended >= generation

    def next_assignment(self):
        """The newest assignment of a generation not yet over; None when the agent is gone."""
        with self._cond:
            while True:
                live = [a for a in self._assignments if a["generation"] > self._ended]
                skipped = [a for a in self._assignments if a not in live[-1:]]
                if live or skipped:
                    self._assignments = []
                for assignment in skipped:  # the agent waits for "left" of every assignment
                    self.send(type="left", generation=int(assignment["generation"]))
                if live:
                    return live[-1]
                if self._closed:
                    return None
                self._cond.wait()


class _Snapshot:
    """The copy of the state in the agent's host memory: written whole, then renamed."""

    def __init__(self, path, every_seconds):
        self.path = path
        self.every_seconds = every_seconds
        self.saved_at = time.monotonic()

    def maybe_save(self, state):
        if self.every_seconds is None or time.monotonic() - self.saved_at < self.every_seconds:
            return
        self.save(state)

    def save(self, state):
        self.saved_at = time.monotonic()
        temporary = f"{self.path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "wb") as f:
                f.write(state._to_bytes())
            os.replace(temporary, self.path)
        except OSError as error:  # a full tmpfs: training goes on without the copy
            try:
                os.unlink(temporary)
            except OSError:
                pass
            print(f"lockstep.elastic: state snapshot not written: {error}", flush=True)
            self.every_seconds = None

    def restore_into(self, state):
        """Loads the copy when it is newer than what state holds; True when it did."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except OSError:
            return False
        import torch
        saved = torch.load(io.BytesIO(data), map_location="cpu")
        if saved["step"] <= state.step:
            return False
        state.load_state_dict(saved)
        print(f"lockstep.elastic: resumed from the state snapshot at step {state.step}", flush=True)
        return True


def _wait_for_listener(host, port, timeout_s, over):
    """Rank 0 creates the store's server when it gets the assignment; connecting earlier would
    cost the store client's own retry interval (a second), so poll the port cheaply first."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection((host, port), timeout=1.0).close()
            return
        except OSError:
            over()
            if time.monotonic() > deadline:
                return  # let the store's own connect report the error
            time.sleep(0.005)


# What rank 0's watch subtracts from a generation's arrival count when the generation ends while
# its members gather: every later add then returns a negative count.
_ENDED_WHILE_GATHERING = 1 << 40


def _wait_for_everyone(prefix, world, over, timeout_s, where):
    """Counts this member in and returns once all `world` members are: the last to arrive sets
    the key "everyone" to "1", and the others read that key in one blocking get (the store's
    server answers it the moment the key is set; timeout_s is the store's own timeout, which bounds
    the get). A member costs the store three requests per formation however long it waits: its
    add, and the get (on the wire a wait, then the get); the last, its add and the set.

    A generation that ends while its members gather ends their wait: rank 0's watch
    (_end_arrivals) subtracts _ENDED_WHILE_GATHERING from the count and, unless everyone had
    arrived, sets the key to "ended", which wakes them into GenerationEnded. The count's adds are
    atomic, so exactly one of the last member and the watch sets the key, and a member that comes
    after the end learns it from its own add. One whose rank 0 is gone breaks their connections to
    its store."""
    over()
    try:
        arrived = prefix.add("arrived", 1)
        if arrived < 0:
            everyone = b"ended"
        elif arrived == world:
            prefix.set("everyone", "1")
            return
        else:
            everyone = prefix.get("everyone")  # blocks until the key is set (the store's timeout)
    except RuntimeError as error:  # torch's DistStoreError is one
        over()
        cause = str(error).splitlines()[0] if str(error) else type(error).__name__
        if "timeout" in cause.lower():
            raise RuntimeError(f"{where}: not every member reached the store within "
                               f"{timeout_s:g} s ({cause})") from error
        raise RuntimeError(f"{where}: the store failed while the members gathered ({cause})"
                           ) from error
    if everyone != b"1":
        over()
        raise GenerationEnded(f"{where}: the generation ended while its members gathered")


def _end_arrivals(connect, generation, world, agent, gathered):
    """Rank 0's watch while its generation's members gather: once the agent says the generation
    is over, and unless `gathered` is set first, ends the gathering (see _wait_for_everyone)
    through a connection of its own, since the store's own client may be blocked in the get.
    Ends too when the agent's channel closes (the agent is gone, and the process with it)."""
    while not gathered.is_set():
        if agent.wait_ended(generation, 0.25):
            break
        if agent.closed:
            return
    else:
        return
    try:
        store = connect()
        arrived = store.add(f"lockstep/{generation}/arrived", -_ENDED_WHILE_GATHERING)
        if arrived + _ENDED_WHILE_GATHERING < world:  # the last member has not set the key
            store.set(f"lockstep/{generation}/everyone", "ended")
    except Exception:  # noqa: BLE001 - a store already gone has woken its waiters itself
        pass


def _form_group(assignment, backend, timeout, agent):
    """Forms the assignment's group. Every wait that a failure elsewhere could make endless (the
    store's server not coming, a member not arriving) is bounded, and gives up with
    GenerationEnded as soon as the agent says the generation is over; torch's own waits start
    only once every member is known to be there."""
    import torch.distributed as dist
    generation = int(assignment["generation"])
    rank, world = int(assignment["rank"]), int(assignment["world_size"])
    host, port = assignment["master_addr"], int(assignment["master_port"])

    def over():
        if agent.ended(generation):
            raise GenerationEnded(f"generation {generation} is over")

    if rank != 0:
        _wait_for_listener(host, port, timeout.total_seconds(), over)
    store = _tcp_store(host, port, world, rank == 0, timeout)
    prefix = dist.PrefixStore(f"lockstep/{generation}", store)
    gathered = threading.Event()
    if rank == 0:
        def connect():
            return _tcp_store(host, port, world, False, datetime.timedelta(seconds=5))
        threading.Thread(target=_end_arrivals,
                         args=(connect, generation, world, agent, gathered),
                         name="lockstep-arrivals", daemon=True).start()
    try:
        _wait_for_everyone(prefix, world, over, timeout.total_seconds(),
                           f"generation {generation}, store {host}:{port}")
    finally:
        gathered.set()
    dist.init_process_group(backend, store=prefix, rank=rank, world_size=world, timeout=timeout)


def _tcp_store(host, port, world, is_master, timeout):
    """dist.TCPStore. torch 2.4 on asks for its libuv server by default, and a build without
    libuv (Debian's python3-torch 2.6) refuses that: the classic server then."""
    import torch.distributed as dist
    try:
        return dist.TCPStore(host, port, world, is_master, timeout=timeout,
                             wait_for_workers=False)
    except RuntimeError as error:
        if "libuv" not in str(error):
            raise
        return dist.TCPStore(host, port, world, is_master, timeout=timeout,
                             wait_for_workers=False, use_libuv=False)


def _release_group():
    """Drops this process's group so that its connections close (peers blocked on this rank get
    an error at once instead of their timeout)."""
    import torch.distributed as dist
    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception:  # a broken group may fail to say goodbye; it is gone either way
        pass
    gc.collect()


def _agree_on_state(state, rank, world):
    """Every rank ends holding the newest state of the group (see the module's docstring). The
    bytes travel on the CPU: over the group itself with gloo, over a gloo group beside it with
    another backend (nccl takes only device tensors)."""
    import torch
    import torch.distributed as dist
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    mine = torch.tensor([state.step, int(state._live), -rank], dtype=torch.int64)
    rows = [torch.zeros(3, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(rows, mine, group=group)
    rows = [tuple(row.tolist()) for row in rows]
    best = max(rows)
    if all(row[0] == best[0] and row[1] == 1 for row in rows):
        return  # every rank trained the same steps in memory: they hold the same state
    source = -best[2]
    payload = state._to_bytes() if rank == source else b""
    size = torch.tensor([len(payload)], dtype=torch.int64)
    dist.broadcast(size, source, group=group)
    if rank == source:
        data = torch.frombuffer(bytearray(payload), dtype=torch.uint8)
    else:
        data = torch.empty(int(size.item()), dtype=torch.uint8)
    dist.broadcast(data, source, group=group)
    if rank != source and not (state._live and state.step == best[0]):
        state._load_bytes(data.numpy().tobytes())


def _backend_or_default(backend):
    if backend is not None:
        return backend
    import torch
    return "nccl" if torch.cuda.is_available() else "gloo"


def run(train, state, *, backend=None, timeout=datetime.timedelta(minutes=5),
        snapshot_seconds=30.0):
    """Runs train(ctx) until it returns, through failures of other processes of the job.

    train: called with a Context once per generation; returns when training is done (its value
      is run()'s). An exception it raises ends the process unless the agent confirms that the
      generation is over (a peer failed or the membership changed), in which case train() is
      called again in the next generation with the state in memory.
    state: a State.
    backend: torch.distributed backend; default nccl with CUDA, else gloo.
    timeout: the process group's timeout for collectives and store calls.
    snapshot_seconds: how often the copy of the state in the agent's host memory is refreshed
      (None: never).
    """
    import torch.distributed as dist
    if not isinstance(state, State):
        raise TypeError(f"run(state=...) must be a lockstep.elastic.State, got {type(state)}")
    backend = _backend_or_default(backend)
    agent = _Agent.from_environment()
    if agent is None:
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
        try:
            _agree_on_state(state, dist.get_rank(), dist.get_world_size())
            state._live = True
            return train(Context(state, dist.get_rank(), dist.get_world_size(),
                                 int(os.environ.get("LOCAL_RANK", "0")), 0,
                                 int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
                                 None, None))
        finally:
            _release_group()

    snapshot_path = os.environ.get(SNAPSHOT_FILE, "")
    snapshot = _Snapshot(snapshot_path, snapshot_seconds) if snapshot_path else None
    confirm_s = float(os.environ.get(CONFIRM_SECONDS, "10"))
    # A warm spare joins a group of survivors, whose state wins: reading the copy would only
    # delay the recovery. A process started cold may be the newest there is.
    cold_start = os.environ.get(WARM_SPARE) != "1"
    agent.send(type="hello", protocol=PROTOCOL, pid=os.getpid())
    failed_at = None  # when this process last saw its generation fail (for the recovery line)
    while True:
        assignment = agent.next_assignment()
        if assignment is None:
            raise SystemExit(0 if os.environ.get(WARM_SPARE) == "1" else 1)
        generation = int(assignment["generation"])
        identity.apply(assignment.get("env", {}))
        os.environ.pop(WARM_SPARE, None)
        if cold_start and not state._live and snapshot is not None:
            snapshot.restore_into(state)
        try:
            assigned_at = time.monotonic()
            _form_group(assignment, backend, timeout, agent)
            formed_at = time.monotonic()
            rank, world = dist.get_rank(), dist.get_world_size()
            _agree_on_state(state, rank, world)
            state._live = True
            agent.send(type="training", generation=generation, step=state.step)
            if failed_at is not None:
                now = time.monotonic()
                print(f"lockstep.elastic: training again in generation {generation} at step "
                      f"{state.step}, {now - failed_at:.3f} s after the failure (rendezvous "
                      f"{assigned_at - failed_at:.3f} s, group {formed_at - assigned_at:.3f} s, "
                      f"state {now - formed_at:.3f} s)", flush=True)
                failed_at = None
            ctx = Context(state, rank, world, int(os.environ.get("LOCAL_RANK", "0")), generation,
                          int(assignment.get("restart_count", 0)), agent, snapshot)
            result = train(ctx)
        except Exception as error:  # noqa: BLE001 - decided below: peer failure or our own
            if failed_at is None:
                failed_at = time.monotonic()
            if error.__traceback__ is not None:
                traceback.clear_frames(error.__traceback__)  # their locals hold the group
            ctx = None
            _release_group()
            if isinstance(error, GenerationEnded) or agent.wait_ended(generation, confirm_s):
                print(f"lockstep.elastic: generation {generation} is over "
                      f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''});"
                      f" going on from step {state.step}", flush=True)
                agent.send(type="left", generation=generation)
                continue
            raise
        ctx = None
        # Done: wait for the others before the group goes, so none sees this rank vanish.
        try:
            dist.barrier()
        except Exception:  # noqa: BLE001 - a peer that failed now is its agent's to handle
            pass
        _release_group()
        return result
