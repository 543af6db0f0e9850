"""Warm spares forked from one prepared Python interpreter instead of each started from nothing.

The exec agent keeps a warm spare of a program that uses Lockstep's elastic helper: a second
process of the same command, started ahead of time and waiting in elastic.run(), which takes a
failed process's place at once. Started from nothing, every spare pays the program's imports
again (about 1.8 s of a core for torch), and it pays them while the job trains: on a node whose
cores are all training, each failure costs that CPU time a second time, after the recovery.

This module is that start-up paid once per pod. The agent runs it with the command's interpreter
and flags (`python3 -u -m lockstep.zygote -- train.py --lr 0.1`); it imports the modules named in
LOCKSTEP_EXEC_PRELOAD (default: torch, torch.distributed, numpy) that the script imports itself
(all of them for `-m module`) and nothing else, then waits on its control socket. For each process
the agent asks for (a warm spare; the program of a worker whose join waited, a standby's), it
forks, and the child runs the command's script (or module) as `python3 train.py ...` would, with
the environment, standard output and error, and helper channel the agent sent along; `import torch`
in the script then finds the module already loaded. Forking is safe there because importing runs no
parallel work: nothing has run an OpenMP or BLAS parallel region, which a forked child could not
use (GNU OpenMP's pool does not survive a fork; a child of a process that ran one hangs in its
first), and no process group or CUDA context exists yet. torch's import leaves one idle thread,
which the fork does not copy; the "ready" message says how many threads the zygote has. What the
zygote imported is frozen (gc.freeze) and stays so in the children: they never collect it, which
spares them walking (and copying, page by page) the zygote's objects in every collection; the first
full collection in a child that unfroze them took 0.24 s here against 0.04 s in a process started
normally.

A process the agent forks before its worker has a place (a standby's program: the variable
LOCKSTEP_AWAIT_IDENTITY in its environment names what the place will set) runs the script's
start-up at once; it may take a place only by waiting in lockstep.elastic.run(), and a read of
its rank before that stops it (lockstep/identity.py).

Each spare is the agent's child, like a process it started itself: the zygote forks twice, the
middle process exits at once, and the spare is reparented to the agent (a child subreaper); the
zygote tells the agent the spare's pid only after that. The spare runs nothing until the agent,
having adopted it, writes its go byte (an agent that gave up on the fork closes the pipe and the
spare exits), then asks for SIGKILL when the agent dies (PR_SET_PDEATHSIG), as the agent's own
children do.

Protocol (a SOCK_SEQPACKET socketpair, the zygote's end at LOCKSTEP_ZYGOTE_FD; one message each):
  zygote -> agent  {"ready": true, "preloaded": [...], "not_found": [...], "threads": N,
                    "elastic": B}  once; B: the script imports lockstep.elastic
  agent  -> zygote the spare's environment, NAME=value entries each ended by a NUL byte (bytes,
                   as execve takes them), with four descriptors (SCM_RIGHTS): the spare's
                   standard output, standard error, helper channel (its LOCKSTEP_AGENT_FD names
                   where it received it) and the read end of the agent's go pipe
  zygote -> agent  {"pid": N}  or  {"error": "..."}
  agent  -> spare  one byte on the go pipe once it supervises the spare; a spare that reads
                   end-of-file instead (the agent gave up on this fork, or died) exits at once
The zygote exits when the agent closes its end.
"""
import ast
import ctypes
import gc
import json
import os
import runpy
import socket
import sys
import traceback
import zipfile

from lockstep import identity

ZYGOTE_FD = "LOCKSTEP_ZYGOTE_FD"
PRELOAD = "LOCKSTEP_EXEC_PRELOAD"
DEFAULT_PRELOAD = "torch,torch.distributed,numpy"
AGENT_FD = "LOCKSTEP_AGENT_FD"

# Bounds on what one request may carry.
MAX_REQUEST_BYTES = 1 << 20
REQUEST_FDS = 4  # stdout, stderr, helper channel, go pipe

PR_SET_PDEATHSIG = 1
PR_SET_NAME = 15
SIGKILL = 9
# The zygote's name in ps and top (the kernel's comm, at most 15 bytes); a spare takes back the
# interpreter's.
ZYGOTE_NAME = b"lockstep-zygote"


class Launch:
    """What the command runs: a script (`python3 train.py args`) or a module (`-m pkg args`)."""

    def __init__(self, argv):
        if len(argv) >= 2 and argv[0] == "-m":
            self.module, self.script, self.args = argv[1], None, argv[2:]
        elif argv and not argv[0].startswith("-"):
            self.module, self.script, self.args = None, argv[0], argv[1:]
        else:
            raise SystemExit("lockstep.zygote: usage: python -m lockstep.zygote -- "
                             "(SCRIPT | -m MODULE) [ARG...]; got %r" % (argv,))

    def run(self):
        """Runs the command in this process, as the interpreter would have run it."""
        if self.script is not None:
            path = os.path.abspath(self.script)  # __main__.__file__ is absolute since 3.9
            if not os.path.exists(path):  # as the interpreter says it, with its exit status
                sys.stderr.write("%s: can't open file %r: [Errno 2] No such file or directory\n"
                                 % (sys.executable, path))
                raise SystemExit(2)
            sys.argv = [self.script] + self.args
            if os.path.isfile(path) and not zipfile.is_zipfile(path):
                sys.path[0] = os.path.dirname(os.path.realpath(path))
            else:
                del sys.path[0]  # run_path puts a directory or zip archive there itself
            runpy.run_path(path, run_name="__main__")
        else:
            sys.argv = [self.module] + self.args  # run_module puts the file's path in argv[0]
            sys.path[0] = os.getcwd()
            runpy.run_module(self.module, run_name="__main__", alter_sys=True)


def script_imports(launch):
    """The modules the command's script imports anywhere in its own text, by full name (`import
    torch.nn`: torch.nn; `from lockstep import elastic`: lockstep and lockstep.elastic), or None
    when that cannot be told (a module run with -m, whose file is found only by importing its
    package; a file that does not parse)."""
    if launch.script is None:
        return None
    try:
        with open(launch.script, "rb") as f:
            tree = ast.parse(f.read(), launch.script)
    except (OSError, SyntaxError, ValueError):
        return None
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(node.module + "." + alias.name for alias in node.names)
    return names


def imported_by(imports):
    """The top-level names among script_imports' (`torch.nn`: torch); None stays None."""
    return None if imports is None else {name.split(".")[0] for name in imports}


def waits_in_helper(imports):
    """Whether the script's own text imports lockstep.elastic: the precondition for forking it
    ahead of a place (lockstep/identity.py), not a proof that it calls run()."""
    return imports is not None and any(
        name == "lockstep.elastic" or name.startswith("lockstep.elastic.") for name in imports)


def preload(names):
    preloaded, not_found = [], []
    for name in names:
        try:
            __import__(name)
            preloaded.append(name)
        except Exception as error:  # not installed, or broken: the script will say so itself
            not_found.append("%s (%s: %s)" % (name, type(error).__name__, error))
    return preloaded, not_found


def send(control, **message):
    control.send(json.dumps(message).encode())


def set_process_name(name):
    ctypes.CDLL(None).prctl(PR_SET_NAME, ctypes.c_char_p(name[:15]), 0, 0, 0)


def become_spare(env, fds, agent_pid, name):
    """In the grandchild: waits until the agent supervises it, then takes the spare's place."""
    os.setpgid(0, 0)
    out_fd, err_fd, channel_fd, go_read = fds
    go = os.read(go_read, 1)  # written once the agent adopted this process (it is its child)
    os.close(go_read)
    if go != b"g":  # the agent gave up on this fork or died: nobody would supervise it
        os._exit(127)
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0)
    if os.getppid() != agent_pid:  # the agent died before the prctl took effect
        os._exit(127)
    set_process_name(name)
    env[AGENT_FD.encode()] = str(channel_fd).encode()  # a number free here, unlike the agent's
    # A process forked before it has a place (a standby's): its rank is guarded until it has one.
    awaited = env.pop(identity.AWAIT.encode(), b"")
    os.environb.clear()
    os.environb.update(env)
    if awaited:
        identity.install(os.fsdecode(awaited).split(","), channel_fd)
    reseed()
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    os.close(out_fd)
    os.close(err_fd)
    os.set_inheritable(channel_fd, True)  # as the agent's own children inherit it


def reseed():
    """A process started normally seeds these from the OS at import; a fork would share the
    zygote's draws with every other spare."""
    if "random" in sys.modules:
        sys.modules["random"].seed()
    numpy_random = sys.modules.get("numpy.random")
    if numpy_random is not None:
        numpy_random.seed()


def parse_env(data):
    env = {}
    for entry in data.split(b"\0"):
        name, equals, value = entry.partition(b"=")
        if name and equals:
            env[name] = value
    return env


def fork_spare(control, env, fds, agent_pid, name):
    """Forks the spare twice over; returns True in the spare, None in the zygote."""
    pid_read, pid_write = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    middle = os.fork()
    if middle == 0:
        try:
            spare = os.fork()
            if spare == 0:
                os.close(pid_read)
                os.close(pid_write)
                control.close()
                become_spare(env, fds, agent_pid, name)
                return True
            os.setpgid(spare, spare)  # as the spare does: a signal to its group never misses
            os.write(pid_write, str(spare).encode())
        except BaseException:  # never unwind into the zygote's loop here
            traceback.print_exc()
            os._exit(1)
        os._exit(0)
    for fd in fds:
        os.close(fd)
    os.close(pid_write)
    os.waitpid(middle, 0)  # the spare is the agent's child from here on
    spare = os.read(pid_read, 32)
    os.close(pid_read)
    if spare:
        send(control, pid=int(spare))
    else:
        send(control, error="the middle process ended before it forked the spare")
    return None


def serve(control, agent_pid, name):
    """Answers fork requests; returns only in a forked spare."""
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(control, MAX_REQUEST_BYTES, REQUEST_FDS)
        except ConnectionResetError:
            data, fds = b"", []
        if not data:
            raise SystemExit(0)  # the agent closed its end
        if len(fds) != REQUEST_FDS:
            for fd in fds:
                os.close(fd)
            send(control, error="bad fork request: %d descriptors, expected %d" %
                 (len(fds), REQUEST_FDS))
            continue
        if fork_spare(control, parse_env(data), fds, agent_pid, name):
            return


def main(argv):
    if argv and argv[0] == "--":
        argv = argv[1:]
    launch = Launch(argv)
    control = socket.socket(fileno=int(os.environ.pop(ZYGOTE_FD)))
    agent_pid = os.getppid()
    with open("/proc/self/comm", "rb") as f:
        name = f.read().strip()
    set_process_name(ZYGOTE_NAME)
    modules = [m.strip() for m in os.environ.get(PRELOAD, DEFAULT_PRELOAD).split(",") if m.strip()]
    imports = script_imports(launch)
    imported = imported_by(imports)
    if imported is not None:  # a script that never imports torch does not pay for it here
        modules = [module for module in modules if module.split(".")[0] in imported]
    if launch.script is not None and os.path.isfile(launch.script):
        # Imported from where the script's imports would find them: its directory, not ours.
        sys.path[0] = os.path.dirname(os.path.realpath(launch.script))
    preloaded, not_found = preload(modules)
    gc.collect()
    # The spares never collect what the zygote imported (it lives as long as they do), so their
    # collections neither walk it nor touch the pages they share with the zygote.
    gc.freeze()
    send(control, ready=True, preloaded=preloaded, not_found=not_found,
         threads=len(os.listdir("/proc/self/task")), elastic=waits_in_helper(imports))
    serve(control, agent_pid, name)
    launch.run()


if __name__ == "__main__":
    main(sys.argv[1:])
