"""The cost model of estimate() in an incremental form, for the exact plan search.

The costs are lowering.py's steps and units; what each task allocates, frees and queues is
rules.py's records (the same ones schedule.build_step lays out for estimate()), so no cost term
is restated here. Why it is exact. The step schedule (schedule.py) has a structure that a generic two-stream
simulation does not need but a search can use:

* Forward. The all-gather of step i+1 is issued when step i starts, and the communication
  stream holds nothing else in forward, so both streams start step i together:
  forward time = AG(root) + sum_i seg(f_i, AG_{i+1}), seg(c, a) = s*min(c, a) + max(c, a) - min(c, a)
  (s = overlap slowdown), and every forward allocation happens at the start of a step.
* Backward. Each compute task (a step's backward or a block's recompute) starts with some
  gradient reductions still queued on the communication stream; what it appends (a prefetch
  all-gather when it starts, its reduce-scatter when it ends, a checkpointed block's gathers) and
  whether the next compute task waits for a gather are fixed by the plan's neighbouring choices.
  `run_compute` simulates one compute task against that queue with simulate()'s rules and
  returns its duration, the memory events inside it and the queue left for the next task
  (compiled: costmodel/fold.py runs a stage's tasks in one call).
* Memory. Live bytes at any event = resident states + everything that later steps in forward
  order keep (activations, kept gathered copies, checkpoint inputs) + the local terms of the
  steps around the event. Processing the steps in backward order (head first), every event's
  value is a constant of the steps processed so far plus the (Res + kept) bytes of the steps not
  yet processed, the same for every event; so a partial plan is summarised by a few numbers.

The search (osdp_sim/planner/dp.py) processes plans group by group with stages (`stage_part` of
the group's steps, run from a key by fold.run_stages), pure functions of (key, steps) whose
results are integers in fixed point (TIME_Q seconds, MEM_Q bytes), so sums do not depend on the
order of addition. `fast_estimate` is the same
computation on one plan; tests/test_costmodel_fast.py checks it against estimate() to 1e-9.

Scope: reduce_every_microbatch=True plans (the search space); anything else raises ValueError.
"""

from dataclasses import dataclass, replace
from typing import NamedTuple

from osdp_sim.costmodel import lowering, rules
from osdp_sim.costmodel.lowering import (CommUnit, Step, check_selective, lower_group, optimizer_temp_sums,
                                         root_step, root_unit, unit_optimizer_s)
from osdp_sim.costmodel.states import compute_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.lazy import cached_field
from osdp_sim.model.spec import ModelSpec, OpGroup
from osdp_sim.plan.plan import GroupChoice, Plan

TIME_Q = 2.0 ** -50            # seconds per fixed-point time unit
MEM_Q = 2.0 ** -10             # bytes per fixed-point memory unit
NEG = -(2 ** 62)               # "no event" in fixed point


def qt(x: float) -> int:
    return int(round(x / TIME_Q))


def qm(x: float) -> int:
    return NEG if x == float("-inf") else int(round(x / MEM_Q))


# ---------------------------------------------------------------------------------------------
# Costs of one step: lowering's Step and CommUnit, read through rules.py's records.

@dataclass(frozen=True)
class StepCost:
    """One step of the lowered schedule with its unit (each non-root unit has exactly one step;
    the root has two, embed and head). Everything the fold needs is read from rules.py's records
    of its tasks; the numbers below are read off those records, for the search's bounds."""

    step: Step
    unit: CommUnit
    owns_gather: bool             # its unit is all-gathered before its forward (not the head)
    first_backward: bool          # its backward allocates its unit's gradient; the unit's resident
                                  # states and optimizer work are counted with it
    last_backward: bool           # its backward frees its unit's copy and queues the reductions
    grads_resident: bool          # sharded gradients of earlier micro-steps are live (grad_accum > 1)
    selective: bool               # its block, when checkpointed, is selectively checkpointed
    unit_optimizer_s: float       # its unit's optimizer step (lowering.unit_optimizer_s)

    @cached_field
    def records(self) -> "UnitRecords":
        return unit_records(self.unit, self.grads_resident)

    @cached_field
    def forward_gather(self) -> rules.Collective | None:
        return self.records.forward_gather if self.owns_gather else None

    @property
    def backward_gather(self) -> rules.Collective:
        return self.records.backward_gather

    def forward_task(self, ckpt: rules.Checkpointed | None) -> rules.ComputeTask:
        return rules.forward(self.step, self.unit, ckpt, self.regathers)

    def backward_task(self, own_gather: bool) -> rules.ComputeTask:
        """own_gather: its unit was gathered again for it (so a ddp copy appears at its start)."""
        return rules.backward(self.step, self.unit, allocates_copy=own_gather and self.regathers,
                              allocates_grad=self.first_backward, frees_gathered=self.last_backward)

    # the records' numbers, for the search's bounds (bounds.py, problem.py, additive.py)
    fwd_s = property(lambda self: self.step.fwd_s)
    bwd_s = property(lambda self: self.step.bwd_s)
    act_bytes = property(lambda self: self.step.act_bytes)                  # kept for backward
    fwd_temp_bytes = property(lambda self: self.step.fwd_temp_bytes)        # the logits
    act_grad_bytes = property(lambda self: self.step.act_grad_bytes)
    bwd_temp_bytes = property(lambda self: self.step.bwd_temp_bytes)        # gradient of the logits
    gathered_bytes = property(lambda self: self.unit.gathered_bytes)

    @cached_field
    def forward_memo(self) -> dict:
        """_forward_terms's cache for this step."""
        return {}

    @cached_field
    def gathered_before_forward_bytes(self) -> float:
        """What its own forward gather allocates (0: already gathered)."""
        return 0.0 if self.forward_gather is None else rules.allocated_bytes(self.forward_gather.at_start)

    @cached_field
    def forward_gather_s(self) -> float | None:
        """Its own all-gather's work before its forward (None: already gathered)."""
        return None if self.forward_gather is None else self.forward_gather.work_s

    @cached_field
    def regathers(self) -> bool:
        """Its copy is freed after forward and gathered again for backward."""
        return self.unit.reshards_after_forward

    @cached_field
    def backward_gather_item(self) -> tuple:
        """Its backward gather as the fold's queue item, not ready at end (issued with its task):
        the stages of many step combinations read it."""
        return _queue_item(self.backward_gather) + (False,)

    @cached_field
    def backward_gather_s(self) -> float:
        return self.backward_gather.work_s if self.regathers else 0.0

    @cached_field
    def reduction_items(self) -> tuple | None:
        """The reductions as queue items (work, alloc_at_start, free_at_end, alloc_at_end)."""
        return self.records.reduction_items if self.last_backward else None

    @cached_field
    def resident_bytes(self) -> float:
        """Resident bytes of its unit (params, optimizer states, grads if resident)."""
        return self.records.resident_bytes if self.first_backward else 0.0

    @cached_field
    def optimizer_temp_bytes(self) -> float:
        return self.unit.optimizer_temp_bytes if self.first_backward else 0.0

    @cached_field
    def optimizer_s(self) -> float:
        return self.unit_optimizer_s if self.first_backward else 0.0

    @cached_field
    def recompute_s(self) -> float:
        """Its recompute work when its block is checkpointed."""
        return self.step.sac_recompute_s if self.selective else self.step.recompute_work_s

    @cached_field
    def sac_kept_bytes(self) -> float:
        """Kept by a selectively checkpointed block for it (saved mm outputs)."""
        return self.step.sac_saved_bytes if self.selective else 0.0

    @cached_field
    def pending(self) -> "Pending":
        """pending_of(self), computed once (a stage reads it for every key)."""
        return pending_of(self)

    @cached_field
    def pending_regathered(self) -> "Pending":
        """pending_of(self, True), computed once."""
        return pending_of(self, True)


class UnitRecords(NamedTuple):
    """rules.py's records of one unit's collectives and resident bytes."""

    forward_gather: rules.Collective
    backward_gather: rules.Collective
    reduction_items: tuple[tuple[float, float, float, float], ...]   # as the fold's queue items
    resident_bytes: float


_UNIT_RECORDS: dict = {}          # (id(unit), grads_resident) -> (unit, UnitRecords)
_MAX_UNIT_RECORDS = 200_000


def clear_caches() -> None:
    """Forget every cache of the cost model (units, group times, unit records, stage parts): a
    test that patches a rule of rules.py calls it before and after."""
    lowering.clear_caches()
    _UNIT_RECORDS.clear()
    _PARTS.clear()
    _GROUP_STEPS.clear()


def unit_records(u: CommUnit, grads_resident: bool) -> UnitRecords:
    """Cached by the unit's identity (lowering.make_unit shares a unit across micro-batches)."""
    key = (id(u), grads_resident)
    hit = _UNIT_RECORDS.get(key)
    if hit is None:
        if len(_UNIT_RECORDS) >= _MAX_UNIT_RECORDS:
            _UNIT_RECORDS.clear()
        red = rules.reductions(u, grads_resident=grads_resident)
        res = rules.resident(u, grads_resident=grads_resident, unsharded_grads_resident=False)
        hit = _UNIT_RECORDS[key] = (u, UnitRecords(rules.forward_gather(u), rules.backward_gather(u),
                                                   tuple(map(_queue_item, red)), rules.net_bytes(res)))
    return hit[1]


def _queue_item(c: rules.Collective) -> tuple[float, float, float, float]:
    """A collective as the fold's item: (work, alloc_at_start, free_at_end, alloc_at_end)."""
    if any(d.bytes < 0 for d in c.at_start):
        raise ValueError(f"{c.name}: a collective frees nothing when it starts")
    return (c.work_s, rules.allocated_bytes(c.at_start), rules.freed_bytes(c.at_end),
            rules.allocated_bytes(c.at_end))


def _net(deltas) -> float:
    """Allocations minus frees: the level after a task's start or end events (at equal times
    frees come first, so nothing in between is higher than before or after)."""
    return rules.allocated_bytes(deltas) - rules.freed_bytes(deltas)


@dataclass(frozen=True)
class Config:
    """Everything of a plan except the per-group choices and checkpoint flags."""

    devices: int
    micro_batch: int
    grad_accum: int
    shard_group: int
    precision: str
    optimizer: str
    root: str                     # root strategy
    selective: bool = False       # checkpointed blocks use selective (op-level) checkpointing

    def plan(self, spec: ModelSpec, choices: dict, checkpoint: tuple) -> Plan:
        return Plan(model=spec.config, devices=self.devices, micro_batch=self.micro_batch,
                    choices=choices, checkpoint=checkpoint, grad_accum=self.grad_accum,
                    precision=self.precision, optimizer=self.optimizer,
                    shard_group=self.shard_group,
                    selective=tuple(checkpoint) if self.selective else ())


def config_of(plan: Plan) -> Config:
    """The plan's configuration; `selective` is per block in a plan (block_stages reads it)."""
    return Config(plan.devices, plan.micro_batch, plan.grad_accum, plan.shard_size, plan.precision,
                  plan.optimizer, plan.choices["root"].strategy)


def group_shape(g: OpGroup) -> tuple:
    """Everything of a group the cost model reads, without its name."""
    return (g.kind, tuple((l.in_features, l.out_features, l.bias, l.copies, l.active) for l in g.linears),
            g.other_params, g.fwd_flops_per_token, g.activations, g.mm_before)


def group_steps(g: OpGroup, choice: GroupChoice, spec: ModelSpec, hw: HardwareProfile,
                cfg: Config) -> tuple[StepCost, ...]:
    """The steps of one group under one choice, in forward order."""
    plan = cfg.plan(spec, {g.plan_key: choice}, ())
    units: list = []
    steps = lower_group(spec, g, -1, hw, plan, units)
    return tuple(StepCost(step=s, unit=units[s.unit], owns_gather=True, first_backward=True, last_backward=True,
                          grads_resident=cfg.grad_accum > 1, selective=cfg.selective,
                          unit_optimizer_s=unit_optimizer_s(hw, units[s.unit], cfg.optimizer))
                 for s in steps)


@dataclass(frozen=True)
class RootCost:
    embed: StepCost
    head: StepCost


def same_step_cost(a: StepCost, b: StepCost) -> bool:
    """Whether two steps cost the same under every rule the fold and the bounds read: equal but
    for their unit's strategy name, with equal unit records, re-gathering and tasks. A zero2 and a
    zero3 root are (FSDP2 does not reshard the root after forward: lowering.CommUnit's
    reshards_after_forward), so the search runs one of them for both (problem.same_costs)."""
    if replace(a, unit=replace(a.unit, strategy="")) != replace(b, unit=replace(b.unit, strategy="")):
        return False
    return (a.records == b.records and a.regathers == b.regathers
            and a.forward_task(None) == b.forward_task(None)
            and all(a.backward_task(own) == b.backward_task(own) for own in (False, True)))


def root_steps(spec: ModelSpec, hw: HardwareProfile, cfg: Config) -> RootCost:
    """The root part of lowering.lower (unit 0 and the embed and head steps) as StepCosts. The
    root is gathered once, before the embedding; the head's backward comes first (it allocates
    the root's gradient), the embedding's last (it frees the copy and reduces)."""
    plan = cfg.plan(spec, {"root": GroupChoice(cfg.root)}, ())
    u = root_unit(spec, hw, plan)
    opt_s = unit_optimizer_s(hw, u, cfg.optimizer)
    made = {}
    for g in spec.groups:
        if g.plan_key != "root":
            continue
        head = g.kind == "head"
        made[g.kind] = StepCost(step=root_step(spec, g, hw, plan, u), unit=u, owns_gather=not head,
                                first_backward=head, last_backward=not head,
                                grads_resident=cfg.grad_accum > 1, selective=False, unit_optimizer_s=opt_s)
    return RootCost(made["embed"], made["head"])


# ---------------------------------------------------------------------------------------------
# One compute task against the communication queue.

def seg(c: float, a: float, s: float) -> float:
    """Two tasks started together on the two streams: both slow by s while overlapped."""
    lo, hi = (c, a) if c <= a else (a, c)
    if lo <= 0:
        return hi
    return lo * s + (hi - lo)


def _fold():
    """costmodel/fold.py, imported on first use: numba (and numpy) load in about half a second,
    which commands that never search or fold do not pay."""
    global _fold_module
    if _fold_module is None:
        from osdp_sim.costmodel import fold
        _fold_module = fold
    return _fold_module


_fold_module = None


def _arena():
    """A new costmodel/stagearena.StageArena (imported on first use, as fold.py)."""
    from osdp_sim.costmodel.stagearena import StageArena
    return StageArena()


def run_compute(c: float, start_deltas: tuple, end_delta: float, queue: tuple, new_items: tuple,
                barrier: int | None, s: float):
    """Run one compute task of work c (> 0) from time 0 (compiled: fold.py).

    queue: items already queued and ready, (remaining, alloc_at_start, free_at_end, alloc_at_end,
    work, started). new_items: (work, alloc_at_start, free_at_end, alloc_at_end, ready_at_end),
    appended in FIFO order (ready_at_end: becomes ready when the compute task ends).
    barrier: index into new_items of the item the next compute task waits for, or None.
    Returns (time until the next compute task starts, max live-byte offset, net offset, queue left).
    Events at equal times: frees before allocations; a zero-duration item's end after both
    (memory.peak_memory's ordering). Items that would start exactly when the next compute task
    starts are left for the next call (same instant, allocation order irrelevant).
    A stage runs its tasks in one call of fold.run_tasks; this is the same for one task.
    """
    fold = _fold()
    tf, ti, items = fold.pack([(c, start_deltas, end_delta, new_items, barrier)])
    dur, net, top, _m1, _m2, left = fold.run_tasks(fold.queue_array(queue), tf, ti, items, *fold.NO_TASKS, s,
                                                   0.0, 0.0, 1)
    return dur, top, net, fold.queue_tuple(left)


# ---------------------------------------------------------------------------------------------
# Stages: processing steps in backward order.

@dataclass(frozen=True)
class Pending:
    """The step whose backward waits for its predecessor to be known."""

    bwd_s: float
    start_deltas: tuple           # deltas when its backward starts (the fold's)
    end_delta: float              # delta when its backward ends
    end_items: tuple              # new queue items appended when it ends (ready at end)
    forward_gather_s: float | None    # its own forward all-gather (for the predecessor's segment)
    gathered_bytes: float             # what that gather allocates


def _start_deltas(deltas) -> tuple[float, ...]:
    """A task's start events as the fold's deltas: the frees (one sum), then each allocation."""
    freed = rules.freed_bytes(deltas)
    return ((-freed,) if freed else ()) + tuple(d.bytes for d in deltas if d.bytes > 0)


def pending_of(st: StepCost, own_gather: bool = False) -> Pending:
    """own_gather: the step's unit was gathered again for it (so a ddp copy appears at its start)."""
    task = st.backward_task(own_gather)
    # One net event at its end: at equal times estimate() applies frees before allocations, so
    # the unsharded gradient allocated at the end never raises the peak above the net value.
    items = tuple(q + (True,) for q in (st.reduction_items or ()))
    return Pending(task.work_s, _start_deltas(task.at_start), _net(task.at_end), items, st.forward_gather_s,
                   st.gathered_before_forward_bytes)


def _recompute_task(steps: tuple, ck: float) -> rules.ComputeTask:
    """rules.recompute of a checkpointed block's steps (or a part of it, ck 0); the ddp units
    among the re-gathered ones cast their copies in it."""
    return rules.recompute(-1, tuple(st.step for st in steps), ck, steps[0].selective,
                           tuple(st.unit for st in steps if st.regathers))


@dataclass(frozen=True)
class StageOut:
    key: tuple                    # (Pending | None, queue)
    dt: int                       # schedule time of the newly finished segments (TIME_Q)
    opt: int                      # optimizer time of the new units (TIME_Q)
    s_n: int                      # Res + kept of the new steps (MEM_Q): shifts every past event
    o_v: int                      # new forward events, relative to V before the stage
    o_y: int                      # new backward events, relative to Y before the stage
    d_y: int
    d_v: int                      # Res of the new steps
    pm: int                       # largest local parameter bytes among new units
    o_m1: int = NEG               # "ckmlp": level after its last re-gather, without the attention's
    o_m2: int = NEG               # "ckmlp": events after the recompute starts, without the attention's
    g_a: int = 0                  # "ckattn": the attention's re-gathered bytes (adds to m1 events)
    p_a: int = 0                  # "ckattn": those + the attention's recomputed activations (m2)


class ForwardTerms(NamedTuple):
    """A step's forward as a stage reads it (from rules.forward)."""

    work_s: float
    kept_bytes: float             # left live until its backward (with its own gather's copy)
    start_bytes: float            # allocated when it starts (with its own gather's copy)


def _forward_terms(st: StepCost, ckpt: bool, first: bool, ck: float) -> ForwardTerms:
    """Cached on the step per (checkpointed, the checkpoint bytes its first step holds): the
    search lays out many stages of the same steps."""
    memo = st.forward_memo
    key = (ckpt, ck if first else 0.0)
    hit = memo.get(key)
    if hit is None:
        fwd = st.forward_task(rules.Checkpointed(key[1], st.selective) if ckpt else None)
        own = st.gathered_before_forward_bytes
        hit = memo[key] = ForwardTerms(fwd.work_s, _net(fwd.at_start) + _net(fwd.at_end) + own,
                                       rules.allocated_bytes(fwd.at_start) + own)
    return hit


def mlp_first(mlp: tuple, pend: Pending) -> bool:
    """A checkpointed block can be processed one group at a time ("ckmlp", "ckattn") when its MLP
    re-gathers something with nonzero work and the step before it in backward has a reduction:
    then the gathers queue behind that reduction, which waits for that step's backward, so they
    run with compute idle and the attention's gathers only delay the MLP's. (Under the head,
    which has no reduction, they overlap its backward; a zero-work last gather would start at the
    same instant as the recompute, after it frees the checkpoint. "ckpt" handles both.)"""
    z = [st for st in mlp if st.regathers]
    return bool(z) and z[-1].backward_gather_s > 0 and bool(pend.end_items)


class StagePart(NamedTuple):
    """A stage without its head: what stage_part computes from its steps alone, the same for
    every pending step before them. fold.run_stages joins it with a pending step's backward task
    (the head) and runs the whole stage on a key's queue (fold._join: the head's items, the time
    before the backward tasks and the forward events, the last ones read from the pending step's
    own gather).

    kind (stage_part): "group" (one group of an unchecked block); "ckpt" (a whole checkpointed
    block, ck its checkpoint bytes); "ckmlp" then "ckattn" (a checkpointed block whose MLP
    re-gathers something, one group at a time: its recompute then waits for the block's gathers,
    which run with compute idle, so the attention adds to the MLP's stage only its gather and
    recompute time, and two constants to the MLP's memory events (carried as m1, m2)); "embed"
    (the embedding step, then the reduction tail)."""

    slowdown: float               # the overlap slowdown s the tasks run with
    dt_s: float                   # forward segments but the last (in order)
    last_fwd_s: float             # the last step's forward work (its segment pairs with the pending gather)
    dt_extra_s: float             # added after that segment: "embed"'s root all-gather, "ckattn"'s
                                  # gathers and recompute; 0 else
    o_v_bytes: float              # forward events but the last
    last_event_bytes: float       # the last step's event without the pending step's prefetch
    o_v_floor_bytes: float        # "embed": resident bytes and the root's copy allocated at t = 0; -inf else
    y0_bytes: float               # live-byte offset before the backward tasks (S_N, "ckattn"'s re-gathered bytes)
    first_extra: tuple            # items the pending step's task queues besides its reductions
    extra_first: bool             # ... before them ("group": it prefetches the last step's gather)
    first_barrier: bool           # ... and whether the next task waits for them (the first under
                                  # "group", the last else)
    tail: tuple                   # fold.pack of the tasks after the head (item offsets from 0)
    split: int                    # the head and tail tasks[:split] give o_y; "ckmlp": the rest give o_m2
    new_pend: "Pending | None"    # the pending step the stage leaves
    opt: int                      # StageOut's queue-independent fields, quantised
    s_n: int
    d_v: int
    pm: int                       # summed over the steps
    pm_max: int                   # their largest
    g_a: int
    p_a: int


def _steps_part(steps: tuple, kind: str, s: float, ck: float) -> StagePart:
    ckpt = kind in ("ckpt", "ckmlp", "ckattn")
    first_has_ck = kind in ("ckpt", "ckattn")
    n = len(steps)
    fwd = [_forward_terms(st, ckpt, i == 0 and first_has_ck, ck) for i, st in enumerate(steps)]
    res_n = sum(st.resident_bytes for st in steps)
    s_n = res_n + sum(f.kept_bytes for f in fwd)
    # forward segments and forward events (the last step's pair with the pending step: fold._join)
    dt = 0.0
    o_v = float("-inf")
    prefix = 0.0
    for i in range(n - 1):
        dt += seg(fwd[i].work_s, steps[i + 1].forward_gather_s or 0.0, s)
        # at its start: what it allocates, its own gather's copy and the next step's prefetch
        o_v = max(o_v, res_n + prefix + fwd[i].start_bytes + steps[i + 1].gathered_before_forward_bytes)
        prefix += fwd[i].kept_bytes
    last_event = res_n + prefix + fwd[n - 1].start_bytes
    # backward compute tasks after the pending step's, in backward order:
    # (work, start deltas, end delta, new items, barrier)
    y = s_n
    g_a = p_a = dt_extra = 0.0
    o_v_floor = float("-inf")

    def task(p, extra=(), barrier=None):
        return (p.bwd_s, p.start_deltas, p.end_delta, p.end_items + extra, barrier)

    def recompute():
        rc = _recompute_task(steps, ck)
        return (rc.work_s, _start_deltas(rc.at_start), _net(rc.at_end), (), None)

    chain = [task(st.pending) for st in steps[:0:-1]]   # units already gathered: no prefetch
    extra, barrier = (), False
    new_pend = steps[0].pending
    if kind in ("ckpt", "ckmlp"):
        # the pending step's task queues the block's gathers behind its reductions (the
        # recompute waits for the last)
        extra = tuple(st.backward_gather_item for st in steps if st.regathers)
        barrier = bool(extra)
        tail = [recompute()] + chain
    elif kind == "ckattn":
        # its gathers are allocated before the recompute starts (m1), its ddp copies with it (m2)
        g_a = sum(rules.allocated_bytes(st.backward_gather.at_start) for st in steps if st.regathers)
        rc = _recompute_task(steps, 0.0)
        p_a = g_a + _net(rc.at_start)
        dt_extra = sum(st.backward_gather.work_s for st in steps if st.regathers) + rc.work_s
        y += p_a
        tail = chain
    elif kind == "group":
        # the pending step's task prefetches the last step's gather (the next task waits for it)
        tail = []
        if steps[n - 1].regathers:
            extra, barrier = (steps[n - 1].backward_gather_item,), True
        for j, p in enumerate([st.pending_regathered for st in steps[:0:-1]], start=1):
            nxt = steps[n - 1 - j]
            tail.append((p.bwd_s, p.start_deltas, p.end_delta, (nxt.backward_gather_item,) + p.end_items, 0)
                        if nxt.regathers else task(p))
        new_pend = steps[0].pending_regathered
    else:  # embed: the pending step, then the embedding's backward and the reduction tail
        p = steps[0].pending
        tail = [task(p, (), len(p.end_items) - 1)]
        dt_extra = steps[0].forward_gather_s or 0.0                 # the root all-gather starts the step
        o_v_floor = res_n + steps[0].gathered_before_forward_bytes  # and allocates the root's copy at t=0
        new_pend = None
    pms = [st.optimizer_temp_bytes for st in steps]
    return StagePart(slowdown=s, dt_s=dt, last_fwd_s=fwd[n - 1].work_s, dt_extra_s=dt_extra, o_v_bytes=o_v,
                     last_event_bytes=last_event, o_v_floor_bytes=o_v_floor, y0_bytes=y, first_extra=extra,
                     extra_first=kind == "group", first_barrier=barrier, tail=_fold().pack(tail),
                     split=1 if kind == "ckmlp" else 1 + len(tail), new_pend=new_pend,
                     opt=qt(sum(st.optimizer_s for st in steps)), s_n=qm(s_n), d_v=qm(res_n), pm=qm(sum(pms)),
                     pm_max=qm(max(pms, default=0.0)), g_a=qm(g_a), p_a=qm(p_a))


_PARTS: dict = {}                 # (ids of steps, kind, s, ck) -> (steps, StagePart): the steps held, so their
                                  # ids stay theirs
_MAX_PARTS = 200_000


def stage_part(steps: tuple, kind: str, s: float, ck: float = 0.0) -> StagePart:
    """Process `steps` (forward order) after whatever pending step the later steps leave (see
    StagePart for `kind`); cached by the identity of the StepCosts (the search lays out the same
    steps after many pending steps; hashing the dataclasses costs more than the part saves)."""
    mk = (tuple(map(id, steps)), kind, s, ck)
    hit = _PARTS.get(mk)
    if hit is None:
        if len(_PARTS) >= _MAX_PARTS:
            _PARTS.clear()
        hit = _PARTS[mk] = (steps, _steps_part(steps, kind, s, ck))
    return hit[1]


def run_stage(arena, key: tuple, part: StagePart, pm_sum: bool = False) -> StageOut:
    """The stage of `part` from key (pending step, queue), run by fold.run_stages through a
    stagearena.StageArena (which keeps the part's and the pending step's rows). pm_sum: the
    optimizer temporaries add up (lowering.optimizer_temp_sums)."""
    fold = _fold_module or _fold()
    deltas, left = arena.run_one(fold.queue_array(key[1]), arena.pend_number(key[0]), arena.part_number(part, pm_sum))
    return StageOut((part.new_pend, fold.queue_tuple(left)), *deltas)


# ---------------------------------------------------------------------------------------------
# Labels: the numbers that summarise a partial plan.

@dataclass(frozen=True)
class Label:
    t: int                        # grad_accum * schedule time + optimizer time so far
    u: int                        # max over events so far, relative to the unprocessed Res + kept
    v: int                        # Res of processed steps (base of forward events)
    y: int                        # live bytes at the current backward point, same reference
    pm: int                       # largest local parameter bytes so far
    m1: int = NEG                 # pending events of a checkpointed MLP (see StageOut)
    m2: int = NEG


def start_label(head: StepCost, m: int, s: float) -> tuple[tuple, Label]:
    """The head is processed first: its forward segment, event and resident root states."""
    res = head.resident_bytes
    fwd = head.forward_task(None)
    t = m * qt(seg(fwd.work_s, 0.0, s)) + qt(head.optimizer_s)
    y = qm(res + _net(fwd.at_start) + _net(fwd.at_end))
    u = qm(res + rules.allocated_bytes(fwd.at_start))
    return (head.pending, ()), Label(t, u, qm(res), y, qm(head.optimizer_temp_bytes))


def apply(lab: Label, out: StageOut, m: int, pm_sum: bool = False) -> Label:
    """Monotone in every component of the label (sums with constants and maxima). pm_sum: the
    optimizer temporaries of all units are live together (lowering.optimizer_temp_sums)."""
    u = max(lab.u + out.s_n, lab.v + out.o_v, lab.y + out.o_y,
            lab.m1 + out.s_n + out.g_a, lab.m2 + out.s_n + out.p_a)
    return Label(t=lab.t + m * out.dt + out.opt, u=u, v=lab.v + out.d_v, y=lab.y + out.d_y,
                 pm=lab.pm + out.pm if pm_sum else max(lab.pm, out.pm), m1=lab.y + out.o_m1,
                 m2=lab.y + out.o_m2)


def finish(lab: Label) -> tuple[int, int]:
    """(iteration time, live-byte peak) in fixed point; the optimizer's temporary comes last."""
    return lab.t, max(lab.u, lab.y + lab.pm)


def total_peak_bytes(peak_q: int, hw: HardwareProfile) -> float:
    p = peak_q * MEM_Q
    return p + p * hw.memory.fragmentation + hw.memory.context_bytes


# ---------------------------------------------------------------------------------------------
# One plan.

@dataclass(frozen=True)
class FastEstimate:
    iteration_time_s: float
    peak_memory_bytes: float
    samples_per_s: float


_GROUP_STEPS: dict = {}           # (model config, id of hw, group shape, choice, Config) -> (hw, steps)


def _shared_group_steps(g: OpGroup, choice: GroupChoice, spec: ModelSpec, hw: HardwareProfile,
                        cfg: Config) -> tuple[StepCost, ...]:
    """group_steps, one tuple for every group of the same shape (and across plans): the stage
    plans are cached by the steps' ids, so a plan's blocks of one shape share them."""
    key = (spec.config, id(hw), group_shape(g), choice, cfg)
    hit = _GROUP_STEPS.get(key)
    if hit is None:
        if len(_GROUP_STEPS) >= _MAX_PARTS:
            _GROUP_STEPS.clear()
        hit = _GROUP_STEPS[key] = (hw, group_steps(g, choice, spec, hw, cfg))
    return hit[1]


def block_stages(spec: ModelSpec, plan: Plan, hw: HardwareProfile, cfg: Config):
    """Per block, last first: [(kind, steps, ck), ...] for its stages in processing order."""
    cb = compute_bytes(cfg.precision)
    tokens = cfg.micro_batch * spec.seq_len
    out = []
    for unit in reversed(spec.blocks):
        sel = plan.selective[unit.index]
        bcfg = replace(cfg, selective=sel)
        per = [_shared_group_steps(g, plan.choices[g.plan_key], spec, hw, bcfg) for g in unit.groups]
        if plan.checkpoint[unit.index]:
            ck = (unit.sac_activations if sel else unit.ckpt_activations).bytes_for(cb, tokens)
            out.append([("ckmlp", per[1], ck), ("ckattn", per[0], ck), ("ckpt", per[0] + per[1], ck)])
        else:
            out.append([("group", per[1], 0.0), ("group", per[0], 0.0)])
    return out


def fast_estimate(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> FastEstimate:
    if plan.grad_accum > 1 and not plan.reduce_every_microbatch:
        raise ValueError("fast_estimate covers reduce_every_microbatch=True only")
    check_selective(spec, plan)
    cfg = config_of(plan)
    s = hw.overlap_slowdown
    m = plan.grad_accum
    root = root_steps(spec, hw, cfg)
    pm_sum = optimizer_temp_sums(hw, plan.optimizer)
    key, lab = start_label(root.head, m, s)
    arena = _arena()
    for stages in block_stages(spec, plan, hw, cfg):
        if stages[0][0] == "ckmlp":
            split = mlp_first(stages[0][1], key[0])
            stages = stages[:2] if split else stages[2:]
        for kind, steps, ck in stages:
            out = run_stage(arena, key, stage_part(steps, kind, s, ck), pm_sum)
            lab, key = apply(lab, out, m, pm_sum), out.key
    out = run_stage(arena, key, stage_part((root.embed,), "embed", s), pm_sum)
    lab = apply(lab, out, m, pm_sum)
    t_q, peak_q = finish(lab)
    it_s = t_q * TIME_Q
    return FastEstimate(it_s, total_peak_bytes(peak_q, hw), plan.micro_batch * m * plan.devices / it_s)
