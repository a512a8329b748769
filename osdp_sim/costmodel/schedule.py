"""The task graph and memory events of one training step, following what FSDP2 executes.

Forward: the root unit is all-gathered first (always exposed); while step i computes, the
all-gather of the next step's unit runs (implicit forward prefetch, issued when step i starts).
ZeRO-3 units free their gathered copy when their forward ends; ZeRO-2 and the root keep it until
their backward ends. Backward runs the steps in reverse: a ZeRO-3 unit is gathered again,
prefetched one step ahead (issued when the previous backward step starts; a ddp unit's copy is
made when its own step starts); a checkpointed block first recomputes its forward, which needs
all of its units gathered (a selectively checkpointed one recomputes only what it did not save).
A unit's unsharded gradient appears when its first backward step ends.
When a unit's last backward step ends its gradients are reduce-scattered (all-reduced for ddp
units), then, with hybrid sharding, all-reduced across shard groups. Gathers and reductions share
one communication stream in issue order. The optimizer step follows the last reduction.
"""

from dataclasses import dataclass
from typing import NamedTuple

from osdp_sim.costmodel import rules
from osdp_sim.costmodel.lowering import Lowered
from osdp_sim.costmodel.rules import CATEGORIES, Checkpointed, Delta
from osdp_sim.costmodel.simulate import Task

__all__ = ["CATEGORIES", "MemEvent", "StepSchedule", "build_step"]


class MemEvent(NamedTuple):
    """One allocation (> 0) or free of a task (a named tuple: a step has thousands of them)."""

    task: int              # task index; -1: resident before the step begins
    at: str                # start | end
    delta_bytes: float
    category: str


@dataclass
class StepSchedule:
    tasks: list[Task]
    events: list[MemEvent]


def build_step(low: Lowered, *, reduce: bool, grads_resident: bool, unsharded_grads_resident: bool,
               optimizer: bool) -> StepSchedule:
    """One micro-step. `reduce`: gradients are reduced in this micro-step. `grads_resident`:
    sharded gradients from earlier micro-steps already exist. `unsharded_grads_resident`: unreduced
    gradients accumulated by earlier micro-steps exist. `optimizer`: the step ends with it.
    The tasks and what each allocates are rules.py's records; this lays them out in FSDP2's order."""
    tasks: list[Task] = []
    events: list[MemEvent] = []
    units, steps = low.units, low.steps

    def mem(task: int, at: str, deltas: tuple[Delta, ...]) -> None:
        events.extend([MemEvent(task, at, d.bytes, d.category) for d in deltas])

    def add(rec, deps=()) -> int:
        stream = "compute" if type(rec) is rules.ComputeTask else "comm"
        k = len(tasks)
        tasks.append(Task(rec.name, stream, rec.work_s, rec.kind, tuple(deps)))
        if rec.at_start:
            mem(k, "start", rec.at_start)
        if rec.at_end:
            mem(k, "end", rec.at_end)
        return k

    for u in units:                                       # resident before the step
        mem(-1, "start", rules.resident(u, grads_resident=grads_resident,
                                        unsharded_grads_resident=unsharded_grads_resident))

    # ---- forward ----
    gathered: dict[int, int] = {}            # unit -> all-gather task (gathered copy live)
    last_fwd_step = {s.unit: i for i, s in enumerate(steps)}
    prev = None
    ckpt_started: set[int] = set()           # checkpointed blocks whose first step has run
    for i, s in enumerate(steps):
        u = units[s.unit]
        deps = []
        if s.unit not in gathered:
            ag = add(rules.forward_gather(u), [] if prev is None else [(prev, "start")])
            gathered[s.unit] = ag
            deps.append((ag, "end"))
        ckpt = None
        if s.block >= 0 and low.checkpoint[s.block]:
            first = s.block not in ckpt_started
            ckpt_started.add(s.block)
            ckpt = Checkpointed(low.ckpt_bytes[s.block] if first else 0.0, _selective(low, s.block))
        frees = u.reshards_after_forward and last_fwd_step[s.unit] == i
        t = add(rules.forward(s, u, ckpt, frees), deps)
        if frees:
            del gathered[s.unit]
        prev = t

    # ---- backward ----
    order = list(range(len(steps)))[::-1]
    first_bwd_step = {}
    for i in order:
        first_bwd_step.setdefault(steps[i].unit, i)
    last_bwd_step = {s.unit: i for i, s in reversed(list(enumerate(steps)))}
    block_steps: dict[int, list[int]] = {}
    for i, s in enumerate(steps):
        if s.block >= 0:
            block_steps.setdefault(s.block, []).append(i)

    copy_due: set[int] = set()          # ddp units whose compute copy the next user allocates

    def gather_for_backward(unit: int, issue_after: int | None) -> int | None:
        if unit in gathered:
            return None
        u = units[unit]
        issue = () if issue_after is None else ((issue_after, "start"),)
        ag = add(rules.backward_gather(u), issue)
        if rules.copy_allocation(u):
            copy_due.add(unit)
        gathered[unit] = ag
        return ag

    def take_copy(unit: int) -> bool:
        due = unit in copy_due
        copy_due.discard(unit)
        return due

    prev = None
    recomputed: set[int] = set()
    for pos, i in enumerate(order):
        s = steps[i]
        u = units[s.unit]
        ckpt = s.block >= 0 and low.checkpoint[s.block]
        if ckpt and s.block not in recomputed:
            recomputed.add(s.block)
            deps = []
            for j in block_steps[s.block]:
                ag = gather_for_backward(steps[j].unit, prev)
                if ag is not None:
                    deps.append((ag, "end"))
                elif steps[j].unit in gathered:
                    deps.append((gathered[steps[j].unit], "end"))
            mine = block_steps[s.block]
            copies = tuple(units[steps[j].unit] for j in mine if take_copy(steps[j].unit))
            prev = add(rules.recompute(s.block, tuple(steps[j] for j in mine), low.ckpt_bytes[s.block],
                                       _selective(low, s.block), copies), deps)
        ag = gather_for_backward(s.unit, prev)
        last = last_bwd_step[s.unit] == i
        t = add(rules.backward(s, u, allocates_copy=take_copy(s.unit),
                               allocates_grad=first_bwd_step[s.unit] == i and not unsharded_grads_resident,
                               frees_gathered=last),
                [((ag if ag is not None else gathered[s.unit]), "end")])
        # Prefetch: the next backward step's gather is issued when this step starts, so it sits
        # on the communication stream before this step's gradient reduction.
        if pos + 1 < len(order):
            nxt = steps[order[pos + 1]]
            nxt_ckpt = nxt.block >= 0 and low.checkpoint[nxt.block] and nxt.block not in recomputed
            if not nxt_ckpt and nxt.unit != s.unit:
                gather_for_backward(nxt.unit, t)
        if last:
            del gathered[s.unit]
            if reduce:
                after = t
                for c in rules.reductions(u, grads_resident=grads_resident):
                    after = add(c, ((after, "end"),))
        prev = t

    if optimizer:
        deps = tuple((k, "end") for k, tk in enumerate(tasks) if tk.stream == "comm")[-1:]
        add(rules.optimizer_step(low.optimizer_s, low.optimizer_temp_bytes), deps)
    return StepSchedule(tasks, events)


def _selective(low: Lowered, block: int) -> bool:
    return bool(low.selective) and low.selective[block]
