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

from osdp_sim.costmodel.lowering import Lowered
from osdp_sim.costmodel.simulate import Task

CATEGORIES = ("params", "grads", "optimizer", "activations", "gathered_params", "reduce_buffers",
              "temporaries")


@dataclass(frozen=True)
class MemEvent:
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
    gradients accumulated by earlier micro-steps exist. `optimizer`: the step ends with it."""
    tasks: list[Task] = []
    events: list[MemEvent] = []
    units, steps = low.units, low.steps

    def add(task: Task) -> int:
        tasks.append(task)
        return len(tasks) - 1

    def mem(task: int, at: str, delta: float, cat: str) -> None:
        if delta:
            events.append(MemEvent(task, at, delta, cat))

    for u in units:                                       # resident before the step
        mem(-1, "start", u.states.params, "params")
        mem(-1, "start", u.states.optimizer, "optimizer")
        if grads_resident:
            mem(-1, "start", u.states.grads, "grads")
        if unsharded_grads_resident:
            mem(-1, "start", u.unsharded_grad_bytes, "grads")

    # ---- forward ----
    gathered: dict[int, int] = {}            # unit -> all-gather task (gathered copy live)
    last_fwd_step = {s.unit: i for i, s in enumerate(steps)}
    fwd_task: list[int] = []
    prev = None
    block_of_ckpt_start: dict[int, int] = {}
    for i, s in enumerate(steps):
        u = units[s.unit]
        deps = []
        if s.unit not in gathered:
            issue = [] if prev is None else [(prev, "start")]
            ag = add(Task(f"AG {u.name}", "comm", u.all_gather_s, _gather_kind(u), tuple(issue)))
            mem(ag, "start", u.gathered_bytes, "gathered_params")
            gathered[s.unit] = ag
            deps.append((ag, "end"))
        t = add(Task(f"fwd {s.name}", "compute", s.fwd_s, "fwd", tuple(deps)))
        fwd_task.append(t)
        ckpt = s.block >= 0 and low.checkpoint[s.block]
        if ckpt:
            # The checkpoint keeps the block input, which the first step would otherwise save
            # itself; everything else is live only inside the forward (selective: but for the
            # outputs of the ops it saves, SDPA's with the input, each step's mms with it).
            transient = s.act_bytes
            if s.block not in block_of_ckpt_start:
                block_of_ckpt_start[s.block] = t
                mem(t, "start", low.ckpt_bytes[s.block], "activations")
                transient = max(0.0, transient - low.ckpt_bytes[s.block])
            if _selective(low, s.block):
                mem(t, "start", s.sac_saved_bytes, "activations")
            mem(t, "start", transient, "activations")
            mem(t, "end", -transient, "activations")
        else:
            mem(t, "start", s.act_bytes, "activations")
        mem(t, "start", s.fwd_temp_bytes, "temporaries")
        mem(t, "end", -s.fwd_temp_bytes, "temporaries")
        if u.reshards_after_forward and last_fwd_step[s.unit] == i:
            mem(t, "end", -u.gathered_bytes, "gathered_params")
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
        ag = add(Task(f"AG(bwd) {u.name}", "comm", u.all_gather_s, _gather_kind(u), issue))
        if _gather_kind(u) == "copy":
            # FSDP2 does not all-gather over a shard group of one rank: a prefetch allocates
            # nothing, the unit casts its copy in its own pre-backward (or the recompute's
            # pre-forward).
            copy_due.add(unit)
        else:
            mem(ag, "start", u.gathered_bytes, "gathered_params")
        gathered[unit] = ag
        return ag

    def allocate_copy(unit: int, task: int) -> None:
        if unit in copy_due:
            copy_due.discard(unit)
            mem(task, "start", units[unit].gathered_bytes, "gathered_params")

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
            sel = _selective(low, s.block)
            work = sum(steps[j].sac_recompute_s if sel else steps[j].recompute_work_s for j in block_steps[s.block])
            rc = add(Task(f"recompute block{s.block}", "compute", work, "recompute", tuple(deps)))
            for j in block_steps[s.block]:
                allocate_copy(steps[j].unit, rc)
            # Recompute re-saves the block's activations; the input it saves is the tensor the
            # checkpoint already holds, so the block goes back to exactly its unchecked size.
            for j in block_steps[s.block]:
                mem(rc, "start", steps[j].act_bytes, "activations")
            mem(rc, "start", -low.ckpt_bytes[s.block], "activations")
            if sel:
                # the saved outputs go back into the recomputed graph: the block is at its
                # unchecked size again, as after a full recompute
                mem(rc, "start", -sum(steps[j].sac_saved_bytes for j in block_steps[s.block]),
                    "activations")
            prev = rc
        deps = []
        ag = gather_for_backward(s.unit, prev)
        deps.append(((ag if ag is not None else gathered[s.unit]), "end"))
        t = add(Task(f"bwd {s.name}", "compute", s.bwd_s, "bwd", tuple(deps)))
        allocate_copy(s.unit, t)
        mem(t, "start", s.act_grad_bytes + s.bwd_temp_bytes, "temporaries")
        mem(t, "end", -(s.act_grad_bytes + s.bwd_temp_bytes), "temporaries")
        mem(t, "end", -s.act_bytes, "activations")
        if first_bwd_step[s.unit] == i and not unsharded_grads_resident:
            # The weight gradients are the last outputs of a step's backward (autograd computes
            # them after the input gradient, from the same saved tensors); MemTracker records
            # none of them at the head's backward peak (docs/cost-model.md, memory timeline).
            mem(t, "end", u.unsharded_grad_bytes, "grads")
        # Prefetch: the next backward step's gather is issued when this step starts, so it sits
        # on the communication stream before this step's gradient reduction.
        if pos + 1 < len(order):
            nxt = steps[order[pos + 1]]
            nxt_ckpt = nxt.block >= 0 and low.checkpoint[nxt.block] and nxt.block not in recomputed
            if not nxt_ckpt and nxt.unit != s.unit:
                gather_for_backward(nxt.unit, t)
        if last_bwd_step[s.unit] == i:
            mem(t, "end", -u.gathered_bytes, "gathered_params")
            del gathered[s.unit]
            if reduce:
                _reduce(add, mem, u, t, grads_resident)
        prev = t

    if optimizer:
        deps = tuple((k, "end") for k, tk in enumerate(tasks) if tk.stream == "comm")[-1:]
        op = add(Task("optimizer step", "compute", low.optimizer_s, "optimizer", deps))
        mem(op, "start", low.optimizer_temp_bytes, "temporaries")
        mem(op, "end", -low.optimizer_temp_bytes, "temporaries")
    return StepSchedule(tasks, events)


def _selective(low: Lowered, block: int) -> bool:
    return bool(low.selective) and low.selective[block]


def _gather_kind(u) -> str:
    # A ddp unit's "gather" is a local copy on the all-gather stream, not communication.
    return "copy" if u.strategy == "ddp" else "all_gather"


def _reduce(add, mem, u, after: int, grads_resident: bool) -> None:
    rs = add(Task(f"{'RS' if u.reduce_kind == 'reduce_scatter' else 'AR'} {u.name}", "comm",
                  u.reduce_s, u.reduce_kind, ((after, "end"),)))
    mem(rs, "start", u.reduce_buffer_bytes, "reduce_buffers")
    mem(rs, "end", -u.reduce_buffer_bytes, "reduce_buffers")
    mem(rs, "end", -u.unsharded_grad_bytes, "grads")
    if not grads_resident:
        mem(rs, "end", u.states.grads, "grads")
    if u.replica_all_reduce_s > 0:
        add(Task(f"AR(replicas) {u.name}", "comm", u.replica_all_reduce_s, "all_reduce", ((rs, "end"),)))
