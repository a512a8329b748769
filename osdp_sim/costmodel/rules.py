"""What FSDP2 does in one training step, per unit and per step, written once.

Each function states one task of the step as a record: its work, the bytes it allocates when it
starts and frees when it ends (by memory category), and, for a collective, what it holds while it
runs. Two evaluators read the same records:

* schedule.build_step lays them out as a task graph (who waits for whom) for the event simulator
  of estimate(): timelines, breakdowns, the test oracle;
* fast.py folds them incrementally for the search: a record's deltas, netted as the memory
  walk's ordering allows (at equal times frees before allocations, memory.peak_memory), become
  the compiled fold's start and end deltas and queue items (costmodel/fold.py).

A new cost term (a temporary, a buffer, a collective) is written here and both paths see it. The
order of the tasks (forward prefetch one step ahead, backward prefetch issued when the previous
backward step starts, reductions when a unit's last backward step ends) is each evaluator's to
lay out; its parameters are these records.
"""

from typing import NamedTuple

from osdp_sim.costmodel.lowering import CommUnit, Step

PARAMS = "params"
GRADS = "grads"
OPTIMIZER = "optimizer"
ACTIVATIONS = "activations"
GATHERED = "gathered_params"
REDUCE_BUFFERS = "reduce_buffers"
TEMPORARIES = "temporaries"
CATEGORIES = (PARAMS, GRADS, OPTIMIZER, ACTIVATIONS, GATHERED, REDUCE_BUFFERS, TEMPORARIES)


class Delta(NamedTuple):
    """Bytes allocated (> 0) or freed (< 0) at a task's start or end. (The records are named
    tuples: the search builds a few for every step it costs, a frozen dataclass's init is slower.)"""

    bytes: float
    category: str                 # one of CATEGORIES


class ComputeTask(NamedTuple):
    """One task on the compute stream."""

    name: str
    kind: str                     # fwd | bwd | recompute | optimizer
    work_s: float                 # duration when running alone
    at_start: tuple[Delta, ...] = ()
    at_end: tuple[Delta, ...] = ()


class Collective(NamedTuple):
    """One item on the communication stream (a ddp unit's "gather" is a local copy on it)."""

    name: str
    kind: str                     # all_gather | copy | reduce_scatter | all_reduce
    work_s: float
    at_start: tuple[Delta, ...] = ()
    at_end: tuple[Delta, ...] = ()


def _deltas(*pairs: tuple[float, str]) -> tuple[Delta, ...]:
    return tuple([Delta(b, c) for b, c in pairs if b])


def net_bytes(deltas: tuple[Delta, ...]) -> float:
    return sum([d.bytes for d in deltas])


def allocated_bytes(deltas: tuple[Delta, ...]) -> float:
    return sum([d.bytes for d in deltas if d.bytes > 0])


def freed_bytes(deltas: tuple[Delta, ...]) -> float:
    """What the deltas free, as a positive number."""
    return -sum([d.bytes for d in deltas if d.bytes < 0])


# ---- resident state --------------------------------------------------------------------------

def resident(u: CommUnit, *, grads_resident: bool, unsharded_grads_resident: bool) -> tuple[Delta, ...]:
    """A unit's bytes live before the step begins: its sharded parameters and optimizer states,
    the sharded gradients of earlier micro-steps (`grads_resident`) or their unreduced gradients
    (`unsharded_grads_resident`, no reduction every micro-step)."""
    return _deltas((u.states.params, PARAMS), (u.states.optimizer, OPTIMIZER),
                   (u.states.grads if grads_resident else 0.0, GRADS),
                   (u.unsharded_grad_bytes if unsharded_grads_resident else 0.0, GRADS))


# ---- gathers ---------------------------------------------------------------------------------

def gather_kind(u: CommUnit) -> str:
    # A ddp unit's "gather" is a local copy on the all-gather stream, not communication.
    return "copy" if u.strategy == "ddp" else "all_gather"


def forward_gather(u: CommUnit) -> Collective:
    """The all-gather before a unit's first forward step; its output is allocated when it starts."""
    return Collective(f"AG {u.name}", gather_kind(u), u.all_gather_s, _deltas((u.gathered_bytes, GATHERED)))


def backward_gather(u: CommUnit) -> Collective:
    """The all-gather of a unit resharded after forward, again before its backward. FSDP2 does not
    all-gather over a shard group of one rank: a ddp unit's prefetch allocates nothing, the unit
    casts its copy in its own pre-backward (or the recompute's pre-forward): copy_allocation."""
    held = 0.0 if u.strategy == "ddp" else u.gathered_bytes
    return Collective(f"AG(bwd) {u.name}", gather_kind(u), u.all_gather_s, _deltas((held, GATHERED)))


def copy_allocation(u: CommUnit) -> tuple[Delta, ...]:
    """A ddp unit's compute copy, allocated when its first user starts (see backward_gather)."""
    return _deltas((u.gathered_bytes if u.strategy == "ddp" else 0.0, GATHERED))


# ---- forward ---------------------------------------------------------------------------------

class Checkpointed(NamedTuple):
    """A step's place in a checkpointed block."""

    input_bytes: float            # > 0 on the block's first step: what the checkpoint keeps
                                  # (its input; selective: also SDPA's outputs)
    selective: bool               # op-level checkpointing: the step keeps its saved mm outputs


def forward(s: Step, u: CommUnit, ckpt: Checkpointed | None, frees_gathered: bool) -> ComputeTask:
    """One step's forward. Unchecked it keeps its activations for backward; in a checkpointed block
    they live only inside the forward: the checkpoint keeps the block input, which the first step
    would otherwise save itself (selective: also the outputs of the ops it saves). A unit
    resharded after forward frees its gathered copy when its last forward step ends."""
    start, end = [], []
    if ckpt is None:
        start.append((s.act_bytes, ACTIVATIONS))
    else:
        transient = s.act_bytes
        if ckpt.input_bytes:
            start.append((ckpt.input_bytes, ACTIVATIONS))
            transient = max(0.0, transient - ckpt.input_bytes)
        if ckpt.selective:
            start.append((s.sac_saved_bytes, ACTIVATIONS))
        start.append((transient, ACTIVATIONS))
        end.append((-transient, ACTIVATIONS))
    start.append((s.fwd_temp_bytes, TEMPORARIES))
    end.append((-s.fwd_temp_bytes, TEMPORARIES))
    if frees_gathered:
        end.append((-u.gathered_bytes, GATHERED))
    return ComputeTask(f"fwd {s.name}", "fwd", s.fwd_s, _deltas(*start), _deltas(*end))


# ---- backward --------------------------------------------------------------------------------

def recompute(block: int, steps: tuple[Step, ...], input_bytes: float, selective: bool,
              copies: tuple[CommUnit, ...] = ()) -> ComputeTask:
    """A checkpointed block's forward again, before its first backward step. It re-saves the
    block's activations; the input it saves is the tensor the checkpoint already holds, so the
    block goes back to exactly its unchecked size (selective: the saved outputs go back into the
    recomputed graph, the same). `copies`: the ddp units whose copies its pre-forward casts
    (copy_allocation)."""
    work = sum(s.sac_recompute_s if selective else s.recompute_work_s for s in steps)
    saved = sum(s.sac_saved_bytes for s in steps) if selective else 0.0
    copy_bytes = sum(net_bytes(copy_allocation(u)) for u in copies)
    return ComputeTask(f"recompute block{block}", "recompute", work,
                       _deltas((copy_bytes, GATHERED), (sum(s.act_bytes for s in steps), ACTIVATIONS),
                               (-input_bytes, ACTIVATIONS), (-saved, ACTIVATIONS)))


def backward(s: Step, u: CommUnit, *, allocates_copy: bool, allocates_grad: bool,
             frees_gathered: bool) -> ComputeTask:
    """One step's backward. While it runs it holds the gradient of its activations and its
    backward temporaries; it frees its saved activations. The weight gradients are the last
    outputs of a step's backward (autograd computes them after the input gradient, from the same
    saved tensors; MemTracker records none of them at the head's backward peak, docs/cost-model.md),
    so a unit's unsharded gradient appears when its first backward step ends
    (`allocates_grad`); its gathered copy is freed when its last one ends (`frees_gathered`).
    `allocates_copy`: a ddp unit's copy is cast in this step's pre-backward."""
    temp = s.act_grad_bytes + s.bwd_temp_bytes
    start = copy_allocation(u) if allocates_copy else ()
    return ComputeTask(f"bwd {s.name}", "bwd", s.bwd_s, start + _deltas((temp, TEMPORARIES)),
                       _deltas((-temp, TEMPORARIES), (-s.act_bytes, ACTIVATIONS),
                               (u.unsharded_grad_bytes if allocates_grad else 0.0, GRADS),
                               (-u.gathered_bytes if frees_gathered else 0.0, GATHERED)))


def reductions(u: CommUnit, *, grads_resident: bool) -> tuple[Collective, ...]:
    """When a unit's last backward step ends its gradients are reduce-scattered (all-reduced for
    ddp units) through an fp32 buffer where the compute dtype is lower (make_unit); the unsharded
    gradient is freed and the sharded one allocated (unless earlier micro-steps left it); with
    hybrid sharding an all-reduce across shard groups follows."""
    name = f"{'RS' if u.reduce_kind == 'reduce_scatter' else 'AR'} {u.name}"
    out = [Collective(name, u.reduce_kind, u.reduce_s, _deltas((u.reduce_buffer_bytes, REDUCE_BUFFERS)),
                      _deltas((-u.reduce_buffer_bytes, REDUCE_BUFFERS), (-u.unsharded_grad_bytes, GRADS),
                              (0.0 if grads_resident else u.states.grads, GRADS)))]
    if u.replica_all_reduce_s > 0:
        out.append(Collective(f"AR(replicas) {u.name}", "all_reduce", u.replica_all_reduce_s))
    return tuple(out)


def optimizer_step(work_s: float, temp_bytes: float) -> ComputeTask:
    """The optimizer step after the last reduction, with its temporaries (lowering.lower)."""
    return ComputeTask("optimizer step", "optimizer", work_s, _deltas((temp_bytes, TEMPORARIES)),
                       _deltas((-temp_bytes, TEMPORARIES)))
