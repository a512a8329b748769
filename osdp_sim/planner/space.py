"""The plan space the search covers: per-group choices, checkpointing, batch and sharding settings."""

from dataclasses import dataclass

from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.plan.plan import OPTIMIZERS, PRECISIONS, STRATEGIES, GroupChoice

REPLICATED = ("ddp", "zero2")


@dataclass(frozen=True)
class SearchSpace:
    """What may vary. Every block's attention and MLP group independently takes any of
    group_choices(space); every block is checkpointed or not (`checkpoint`: False, True (full
    recompute), "selective" (torchtitan's op-level policy)); the root group (embedding + head)
    takes one of `root_strategies` unsplit. The policy of the checkpointed blocks is one per
    configuration, like the micro-batch: a plan's checkpointed blocks are all full or all
    selective (checkpoint_variants; docs/search.md, "Selective checkpointing").

    micro_batches: None = 1, 2, 3, ... up to the largest at which some plan fits.
    global_batch: None = no gradient accumulation; else grad_accum = global_batch /
    (micro_batch * devices), and micro-batches for which that is not a whole number are skipped.
    shard_groups: None = every divisor of the device count that is a whole number of nodes (one
    node included) on multi-node profiles, [devices] on one node.
    devices: None = the profile's count.
    """

    strategies: tuple[str, ...] = STRATEGIES
    splits: tuple[int, ...] = (1, 2, 4, 8)
    checkpoint: tuple[bool | str, ...] = (False, True)
    micro_batches: tuple[int, ...] | None = None
    global_batch: int | None = None
    shard_groups: tuple[int, ...] | None = None
    precision: str = "bf16"
    optimizer: str = "adamw"
    devices: int | None = None
    root_strategies: tuple[str, ...] | None = None

    def __post_init__(self):
        if not self.strategies or any(s not in STRATEGIES for s in self.strategies):
            raise UserError(f"strategies must be a non-empty subset of {', '.join(STRATEGIES)}; "
                            f"got {list(self.strategies)}", field="strategies")
        for k in self.splits:
            if not isinstance(k, int) or k < 1:
                raise UserError(f"splits must be positive integers; got {k!r}", field="splits")
        if not self.checkpoint or any(c not in (False, True, "selective") or
                                      (isinstance(c, int) and not isinstance(c, bool))
                                      for c in self.checkpoint):
            raise UserError('checkpoint must list some of False, True and "selective"', field="checkpoint")
        if self.micro_batches is not None and (not self.micro_batches or
                                               any(not isinstance(b, int) or b < 1 for b in self.micro_batches)):
            raise UserError("micro_batches must be positive integers", field="micro_batches")
        if self.global_batch is not None and self.global_batch < 1:
            raise UserError("global_batch must be a positive integer", field="global_batch")
        if self.precision not in PRECISIONS:
            raise UserError(f"precision must be one of {', '.join(PRECISIONS)}", field="precision")
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"optimizer must be one of {', '.join(OPTIMIZERS)}", field="optimizer")
        roots = self.root_strategies if self.root_strategies is not None else self.strategies
        if not roots or any(s not in STRATEGIES for s in roots):
            raise UserError(f"root_strategies must be a non-empty subset of {', '.join(STRATEGIES)}",
                            field="root_strategies")

    @property
    def roots(self) -> tuple[str, ...]:
        return tuple(self.root_strategies if self.root_strategies is not None else self.strategies)


def group_choices(space: SearchSpace) -> list[GroupChoice]:
    """The distinct per-group options, in a fixed order: the unsplit strategies, then for each
    split k > 1 the j-of-k sharded slices over a ddp or zero2 remainder (j = 1..k-1), then
    zero3 split k. j = 0 is the unsplit replicated strategy, listed once."""
    out: list[GroupChoice] = []
    seen = set()

    def add(c: GroupChoice):
        if c not in seen:
            seen.add(c)
            out.append(c)

    for s in space.strategies:
        add(GroupChoice(s))
    for k in sorted(set(space.splits)):
        if k == 1:
            continue
        for rep in REPLICATED:
            if rep in space.strategies:
                for j in range(1, k):
                    add(GroupChoice(rep, k, j))
        if "zero3" in space.strategies:
            add(GroupChoice("zero3", k, k))
    return out


@dataclass(frozen=True)
class CheckpointVariant:
    """One checkpoint policy of a configuration: the per-block options the search takes for it
    (False: not checkpointed; True: checkpointed with this policy) and the group choices."""

    selective: bool
    options: tuple[bool, ...]
    choices: tuple[GroupChoice, ...]


def checkpoint_variants(space: SearchSpace, spec=None) -> list[CheckpointVariant]:
    """The full-recompute variant (when True is allowed, or nothing is checkpointed) and the
    selective one (when "selective" is allowed). A model whose MLP's saved mms depend on the
    attention's split (an odd number of bias-free attention Linears, costmodel/lowering.py
    check_selective) searches its selective variant unsplit."""
    choices = tuple(group_choices(space))
    out = []
    if True in space.checkpoint or "selective" not in space.checkpoint:
        out.append(CheckpointVariant(False, tuple(sorted({bool(c) for c in space.checkpoint
                                                          if not isinstance(c, str)})), choices))
    if "selective" in space.checkpoint:
        if spec is not None:
            from osdp_sim.model.spec import selective_supported
            why = selective_supported(spec.config)
            if why:
                raise UserError(why, source=spec.config.source or spec.name, field="checkpoint")
            if any(u.groups[1].mm_before % 2 for u in spec.blocks):
                choices = tuple(c for c in choices if not c.is_split) or choices[:1]
        out.append(CheckpointVariant(True, tuple(sorted({c is not False for c in space.checkpoint
                                                         if c is not True})), choices))
    return out


def checkpointing_allowed(space: SearchSpace) -> bool:
    return any(c is not False for c in space.checkpoint)


def devices_of(space: SearchSpace, hw: HardwareProfile) -> int:
    d = space.devices or hw.device.count
    if d < 1:
        raise UserError("devices must be positive", field="devices")
    return d


def shard_groups_of(space: SearchSpace, hw: HardwareProfile, devices: int) -> tuple[int, ...]:
    if space.shard_groups is not None:
        bad = [g for g in space.shard_groups if g < 1 or devices % g]
        if bad:
            raise UserError(f"shard group {bad[0]} does not divide {devices} devices", field="shard_groups")
        return tuple(sorted(set(space.shard_groups)))
    per = min(hw.device.per_node, devices)
    if devices <= per:
        return (devices,)
    return tuple(g for g in range(1, devices + 1) if devices % g == 0 and (g == per or g % per == 0))


def grad_accum_of(space: SearchSpace, micro_batch: int, devices: int) -> int | None:
    """Gradient accumulation steps for this micro-batch, or None if it does not divide."""
    if space.global_batch is None:
        return 1
    per_step = micro_batch * devices
    if space.global_batch % per_step:
        return None
    return space.global_batch // per_step
