#!/usr/bin/env python3
"""Rank 0's store load while a generation's members gather, before and after the blocking wait.

lockstep.elastic forms each generation's torch process group at rank 0's TCPStore: every member
counts itself in, then waits for the others. Until 2026-11-29 the waiting members polled the count
every 2 ms; now they read one key in a blocking get (elastic._wait_for_everyone). Here a real
TCPStore (rank 0's, in this process) serves --ranks members in forked processes; all but one
arrive at once and the last comes --late seconds later, as a member that is still loading its
data. Both protocols run in one invocation, --reps times each, alternating. Printed per protocol
(medians): the store requests the members made while they gathered, per second of the gather
(torch's blocking get counts two: on the wire it is a wait, then a get);
this process's CPU time in that window (the store's server thread is all that runs in it), as a
share of one core; and how long the waiting members took to be released after the last arrived.

  ~/.cache/lockstep/trixie-torch/python3 bench/elastic_arrival/run.py [--ranks 64] [--late 2]

Needs torch (scripts/trixie-torch.sh makes an interpreter that has it).
"""
import argparse
import datetime
import multiprocessing
import os
import resource
import socket
import statistics
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import torch.distributed as dist  # noqa: E402
from lockstep import elastic  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=120)


class Counting:
    """A PrefixStore that counts the requests it sends: one per call, two for a get (torch's
    client waits for the key, then gets it)."""

    def __init__(self, store):
        self.store, self.requests = store, 0

    def __getattr__(self, name):
        method = getattr(self.store, name)

        def counted(*args):
            self.requests += 2 if name == "get" else 1
            return method(*args)
        return counted


def polling_wait(prefix, world):
    """The wait as lockstep.elastic had it before: the count read every 2 ms."""
    prefix.add("arrived", 1)
    while prefix.add("arrived", 0) < world:
        time.sleep(0.002)


def blocking_wait(prefix, world):
    elastic._wait_for_everyone(prefix, world, lambda: None, TIMEOUT.total_seconds(), "bench")


def member(protocol, port, world, round_id, delay_s, start_at, results):
    store = elastic._tcp_store("127.0.0.1", port, world, False, TIMEOUT)
    prefix = Counting(dist.PrefixStore(f"lockstep/{round_id}", store))
    time.sleep(max(0.0, start_at + delay_s - time.monotonic()))
    arrived = time.monotonic()
    (polling_wait if protocol == "polling" else blocking_wait)(prefix, world)
    results.put((arrived, time.monotonic(), prefix.requests))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def one_round(protocol, ranks, late_s, round_id):
    port = free_port()
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    start_at = time.monotonic() + 1.0  # every member connected by then
    processes = [context.Process(target=member, args=(
        protocol, port, ranks, round_id, late_s if i == ranks - 1 else 0.0, start_at, results))
        for i in range(ranks)]
    for process in processes:
        process.start()
    # The server's thread starts after the fork: the members connect to it, retrying until it
    # listens.
    master = elastic._tcp_store("127.0.0.1", port, ranks + 1, True, TIMEOUT)
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    wall_before = time.monotonic()
    rows = [results.get(timeout=TIMEOUT.total_seconds()) for _ in processes]
    cpu_after = resource.getrusage(resource.RUSAGE_SELF)
    wall = time.monotonic() - wall_before
    for process in processes:
        process.join(30)
    del master
    last_arrival = max(arrived for arrived, _, _ in rows)
    releases = [released - last_arrival for _, released, _ in rows]
    cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (cpu_before.ru_utime + cpu_before.ru_stime)
    return {"calls_per_s": sum(r for _, _, r in rows) / wall, "cpu_share": cpu / wall,
            "release_median_ms": 1000 * statistics.median(releases),
            "release_max_ms": 1000 * max(releases)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=64)
    parser.add_argument("--late", type=float, default=2.0, help="seconds the last member is late")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    figures = {"polling": [], "blocking": []}
    round_id = 0
    for _ in range(args.reps):
        for protocol in ("polling", "blocking"):
            round_id += 1
            figures[protocol].append(one_round(protocol, args.ranks, args.late, round_id))
    print(f"{args.ranks} ranks, the last {args.late:g} s late; medians of {args.reps} rounds")
    print(f"{'protocol':<10}{'store requests/s':>18}{'store CPU (cores)':>19}"
          f"{'release median ms':>19}{'release max ms':>16}")
    for protocol, rounds in figures.items():
        def med(key):
            return statistics.median(r[key] for r in rounds)
        print(f"{protocol:<10}{med('calls_per_s'):>18.0f}{med('cpu_share'):>19.2f}"
              f"{med('release_median_ms'):>19.1f}{med('release_max_ms'):>16.1f}")


if __name__ == "__main__":
    main()
