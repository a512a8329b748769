"""A sharding plan: a choice per operator group, checkpointing per block, and the global settings."""

from dataclasses import dataclass, field, replace

from osdp_sim.model.config import ModelConfig

STRATEGIES = ("ddp", "zero2", "zero3")
SPLITS = (1, 2, 4, 8)
PRECISIONS = ("fp32", "bf16")
OPTIMIZERS = ("adamw", "sgd")


@dataclass(frozen=True, order=True)
class GroupChoice:
    """How one operator group is sharded.

    Unsplit (slices == 1): `strategy` is ddp, zero2 or zero3 for the whole group.
    Split (slices k > 1): the group's Linear weights are cut into k slices along their input
    features; `sharded_slices` j of them are ZeRO-3 (each its own FSDP unit, gathered one at a
    time), the rest (and the group's biases and norms) use `strategy` (ddp or zero2).
    `zero3` with k slices shards all k. j = 0 is the same plan as the unsplit replicated strategy.
    """

    strategy: str = "zero3"
    slices: int = 1
    sharded_slices: int = 0

    def __post_init__(self):
        if self.strategy == "zero3" and self.slices > 1 and self.sharded_slices != self.slices:
            object.__setattr__(self, "sharded_slices", self.slices)
        if self.strategy != "zero3" and self.sharded_slices == 0 and self.slices > 1:
            object.__setattr__(self, "slices", 1)
        if self.slices == 1 and self.strategy != "zero3":
            object.__setattr__(self, "sharded_slices", 0)
        if self.slices == 1 and self.strategy == "zero3":
            object.__setattr__(self, "sharded_slices", 1)

    @property
    def is_split(self) -> bool:
        return self.slices > 1

    @property
    def shard_fraction(self) -> float:
        """Fraction of the group's Linear weights that are ZeRO-3 sharded."""
        return self.sharded_slices / self.slices

    @property
    def replicated_strategy(self) -> str:
        """Strategy of what is not ZeRO-3 sharded (biases, norms, unsharded slices)."""
        return self.strategy

    def label(self) -> str:
        if not self.is_split:
            return self.strategy
        if self.strategy == "zero3":
            return f"zero3 split {self.slices}"
        return f"{self.strategy} split {self.slices}/{self.sharded_slices}"


@dataclass(frozen=True)
class Plan:
    model: ModelConfig
    devices: int
    micro_batch: int
    choices: dict[str, GroupChoice]          # plan_key -> choice ('root', 'block{i}.attn', ...)
    checkpoint: tuple[bool, ...]             # per block: checkpointed at all (full or selective)
    grad_accum: int = 1
    precision: str = "bf16"                  # fp32 | bf16 (mixed: bf16 compute, fp32 master/optimizer)
    optimizer: str = "adamw"                 # adamw | sgd (with momentum)
    shard_group: int = 0                     # 0: shard over all devices; s: shard in groups of s (HSDP)
    reduce_every_microbatch: bool = True     # with grad_accum > 1: reduce each micro-batch or once
    notes: dict = field(default_factory=dict, compare=False)
    selective: tuple[bool, ...] = ()
    """Per block: a checkpointed block recomputes only what torchtitan's op-level selective
    policy does not save (docs/cost-model.md, "Selective activation checkpointing"); False: full
    recompute. Only checkpointed blocks may be selective; () means none (all False)."""

    def __post_init__(self):
        if not self.shard_group:
            object.__setattr__(self, "shard_group", self.devices)
        sel = tuple(bool(x) for x in self.selective) or (False,) * len(self.checkpoint)
        if len(sel) != len(self.checkpoint) or any(s and not c for s, c in zip(sel, self.checkpoint)):
            raise ValueError("selective marks checkpointed blocks only, one flag per block")
        object.__setattr__(self, "selective", sel)

    def checkpoint_policy(self, block: int) -> str:
        """'none', 'full' or 'selective'."""
        if not self.checkpoint[block]:
            return "none"
        return "selective" if self.selective[block] else "full"

    @property
    def shard_size(self) -> int:
        return self.shard_group or self.devices

    @property
    def replicas(self) -> int:
        return self.devices // self.shard_size

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.grad_accum * self.devices

    def choice(self, plan_key: str) -> GroupChoice:
        return self.choices[plan_key]

    def with_choices(self, **kw) -> "Plan":
        return replace(self, **kw)


def uniform_plan(model: ModelConfig, strategy: str, *, devices: int, micro_batch: int,
                 checkpoint: bool | str = False, slices: int = 1, **kw) -> Plan:
    """Every group (root included) on one strategy; `slices` > 1 only meaningful for zero3.
    checkpoint: False/'none', True/'full' or 'selective' for every block."""
    from osdp_sim.model.spec import build_spec
    spec = build_spec(model)
    choices = {}
    for key in spec.plan_keys:
        k = slices if (key != "root" and strategy == "zero3") else 1
        choices[key] = GroupChoice(strategy, k, k if strategy == "zero3" else 0)
    on = checkpoint in (True, "full", "selective")
    sel = (checkpoint == "selective",) * model.n_layers
    return Plan(model=model, devices=devices, micro_batch=micro_batch, choices=choices,
                checkpoint=(on,) * model.n_layers, selective=sel, **kw)
