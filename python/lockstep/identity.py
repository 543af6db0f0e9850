"""A program forked before its worker has a place, which must not learn too early who it is.

A worker that waits for a place (a standby, or a worker whose peers are slow to come) has its
program forked ahead of time by its exec agent (python/lockstep/zygote.py), so that the program's
start-up (reading data, building the model, reading its last checkpoint) is done when a place comes
instead of on the recovery's critical path. Until then the program has no identity: none of RANK,
WORLD_SIZE, MASTER_ADDR and the other variables the agent sets per generation (the agent names
them in LOCKSTEP_AWAIT_IDENTITY).

Such a program may take a place only if it waits for it in lockstep.elastic.run(): there it
receives its rank with the assignment, and the state it loaded during its start-up, however old
(a checkpoint read minutes before the place came), gives way to the survivors' newer state. A
program that asks who it is before it gets there (reads RANK to call init_process_group, or to
pick its checkpoint) is not one that can be started ahead: what it read at start-up may be stale
when the place comes, and nothing would reconcile it. This module tells the two apart without
any change to the program: from the fork until the first assignment, os.environ guards those
variables. A read (or a write, listing the environment, or forking a process, which would
inherit what the guard withholds) from any thread
  * once the program is in elastic.run(): waits for the assignment run() acts on, then goes on;
  * before: tells the agent which variable was read ({"type": "awaiting"} on the helper channel)
    and waits until the agent ends the process. The agent starts the command the ordinary way
    when the place comes, and stops forking it ahead.

Not guarded: reads through the C library (getenv in an extension module) and processes started
with subprocess (without preexec_fn) or posix_spawn, which see the variables unset. The agent forks ahead only a
script whose own text imports lockstep.elastic (zygote.py tells it), and gives up on forking
ahead once a program ended before reaching run(). The CUDA device variables are the pod's, not
the generation's, and are set from the start. A process that never gets a place is ended with its
worker.
"""
import json
import os
import threading

AWAIT = "LOCKSTEP_AWAIT_IDENTITY"

_cond = threading.Condition(threading.RLock())
_pending = frozenset()  # the awaited names, encoded as os.environ keeps them (bytes)
_fd = -1  # the helper channel
_helper = None  # the thread of lockstep.elastic.run(): a read waits for the assignment it applies
_gone = False  # ... and the channel closed


class _Awaiting(os._Environ):
    """os.environ (and os.environb) while the identity is awaited: the class of those objects is
    switched, so references taken earlier (`from os import environ`) are guarded too. (The base
    class is named, not super(): a waiting call returns after the class was switched back.)"""

    def __getitem__(self, key):
        _await_if(self, key)
        return os._Environ.__getitem__(self, key)

    def __setitem__(self, key, value):
        _await_if(self, key)
        os._Environ.__setitem__(self, key, value)

    def __delitem__(self, key):
        _await_if(self, key)
        os._Environ.__delitem__(self, key)

    def __iter__(self):
        resolve("the environment")
        return os._Environ.__iter__(self)

    def __len__(self):
        resolve("the environment")
        return os._Environ.__len__(self)

    def __repr__(self):
        resolve("the environment")
        return os._Environ.__repr__(self)


def _await_if(environ, key):
    try:
        encoded = environ.encodekey(key)
    except TypeError:
        return  # the base class raises its own error for a key of the wrong type
    if encoded in _pending:
        resolve(os.fsdecode(encoded))


def install(names, fd):
    """Guards os.environ's `names` until this process gets a place (the helper channel: `fd`)."""
    global _pending, _fd
    with _cond:
        _fd = fd
        _pending = frozenset(os.fsencode(name) for name in names if name)
        if not _pending:
            return
        if type(os.environ) is not os._Environ or type(os.environb) is not os._Environ:
            _refuse("an environment this helper cannot guard")
        os.environ.__class__ = _Awaiting
        os.environb.__class__ = _Awaiting
        # A child forked now would inherit the guard but not the agent's attention, and one
        # started with exec would see the variables unset: making a process is asking too.
        os.register_at_fork(before=lambda: resolve("a new process (fork)"))


def awaiting():
    """True while this process has no place yet."""
    return bool(_pending)


def resolve(what):
    """Called when the program reads `what`: returns once the identity is in the environment, or
    never (the agent ends a process that asked before it reached elastic.run())."""
    if not _pending:
        return
    with _cond:
        if not _pending:
            return
        if _helper is None:
            _refuse(what)
        if _helper == threading.get_ident():  # it would wait for itself
            raise RuntimeError(f"lockstep: {what} read in elastic.run()'s thread before it has "
                               "its place (a signal handler or finalizer reading the rank?)")
        while _pending and not _gone:
            _cond.wait()
        if _pending:  # the agent ended without giving this process a place
            os._exit(0)


def helper_started():
    """lockstep.elastic owns the channel, from this thread: from now on a read in another thread
    waits for the assignment this one applies."""
    global _helper
    with _cond:
        _helper = threading.get_ident()


def helper_gone():
    """lockstep.elastic's channel closed: nothing will be assigned."""
    global _gone
    with _cond:
        _gone = True
        _cond.notify_all()


def apply(env):
    """Sets an assignment's variables (lockstep.elastic, with the assignment it acts on)."""
    global _pending
    with _cond:
        # The values first, then the guard down: a thread that finds nothing awaited finds them.
        guarded = type(os.environ) is _Awaiting
        for name, value in env.items():
            if guarded:
                os._Environ.__setitem__(os.environ, str(name), str(value))
            else:  # not forked ahead (or a library's own mapping): as any assignment
                os.environ[str(name)] = str(value)
        _pending = frozenset()
        for environ in (os.environ, os.environb):
            if type(environ) is _Awaiting:
                environ.__class__ = os._Environ
        _cond.notify_all()


def _refuse(what):
    """Tells the agent that the program read `what` before it reached elastic.run(), then waits
    for the end the agent gives it (exits 0 if the agent is gone)."""
    line = (json.dumps({"type": "awaiting", "variable": what}) + "\n").encode()
    try:
        os.write(_fd, line)
        while os.read(_fd, 65536):
            pass  # nothing is sent to a process that has no place; end-of-file: the agent ended
    except OSError:
        pass
    os._exit(0)
