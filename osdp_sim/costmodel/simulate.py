"""Two-stream (compute, communication) simulation of a task graph.

Each stream runs its tasks in issue order (FIFO), one at a time. A task starts when it is at the
head of its stream, the stream is free, and its dependencies are met; a dependency is the start or
the end of another task (a prefetch is issued when an earlier compute task *starts*). While both
streams are busy, each progresses at 1/slowdown of its solo rate (Galvatron's and Proteus' overlap
coefficient): a compute task C overlapped by a collective A both stretch, so a fully overlapped
window costs max(C, A) + (slowdown - 1) * min(C, A).
"""

import bisect
import itertools
from dataclasses import dataclass, field

STREAMS = ("compute", "comm")


@dataclass
class Task:
    name: str
    stream: str                      # compute | comm
    work_s: float                    # duration when running alone
    kind: str                        # fwd, bwd, recompute, optimizer, all_gather, reduce_scatter, all_reduce
    deps: tuple = ()                 # ((task_index, "start" | "end"), ...)
    start_s: float = field(default=-1.0)
    end_s: float = field(default=-1.0)


@dataclass(frozen=True)
class Interval:
    start_s: float
    end_s: float
    both_busy: bool


class ScheduleError(RuntimeError):
    """The task graph cannot run (a dependency cycle or a task waiting on a later one)."""


def simulate(tasks: list[Task], slowdown: float = 1.0) -> float:
    """Fill in start_s / end_s of every task; return the makespan."""
    queues = {s: [i for i, t in enumerate(tasks) if t.stream == s] for s in STREAMS}
    head = {s: 0 for s in STREAMS}
    running: dict[str, int] = {}
    remaining: dict[int, float] = {}
    now = 0.0
    done = 0

    def ready(i: int) -> bool:
        for j, what in tasks[i].deps:
            t = tasks[j]
            if what == "start":
                if t.start_s < 0:
                    return False
            elif t.end_s < 0 or t.end_s > now:
                return False
        return True

    while done < len(tasks):
        progressed = True
        while progressed:                      # start everything that can start now
            progressed = False
            for s in STREAMS:
                if s in running or head[s] >= len(queues[s]):
                    continue
                i = queues[s][head[s]]
                if ready(i):
                    tasks[i].start_s = now
                    head[s] += 1
                    if tasks[i].work_s <= 0:
                        tasks[i].end_s = now
                        done += 1
                    else:
                        running[s] = i
                        remaining[i] = tasks[i].work_s
                    progressed = True
        if not running:
            if done < len(tasks):
                stuck = [tasks[queues[s][head[s]]].name for s in STREAMS if head[s] < len(queues[s])]
                raise ScheduleError(f"no task can start at t={now:.6g}s; waiting: {stuck}")
            break
        rate = 1.0 / slowdown if len(running) == 2 else 1.0
        step = min(remaining[i] for i in running.values()) / rate
        now += step
        for s, i in list(running.items()):
            remaining[i] -= step * rate
            if remaining[i] <= 1e-15 * max(1.0, tasks[i].work_s):
                tasks[i].end_s = now
                del running[s]
                done += 1
    return max((t.end_s for t in tasks), default=0.0)


def exposed_comm_s(tasks: list[Task]) -> dict[int, float]:
    """For each comm task, the part of its run during which the compute stream was idle."""
    busy = sorted((t.start_s, t.end_s) for t in tasks if t.stream == "compute" and t.end_s > t.start_s)
    # Intervals before the first whose end (running maximum) passes a task's start are all skipped
    # by the loop below: bisect to it instead of walking from the first (quadratic in layers).
    ends_max = list(itertools.accumulate((b for _, b in busy), max))
    out = {}
    for i, t in enumerate(tasks):
        if t.stream != "comm":
            continue
        covered = 0.0
        for k in range(bisect.bisect_right(ends_max, t.start_s), len(busy)):
            a, b = busy[k]
            if b <= t.start_s:
                continue
            if a >= t.end_s:
                break
            covered += min(b, t.end_s) - max(a, t.start_s)
        out[i] = max(0.0, (t.end_s - t.start_s) - covered)
    return out
