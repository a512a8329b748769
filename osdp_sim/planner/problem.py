"""One search configuration (micro-batch, accumulation, shard group, root strategy) as tables:
the steps of every group under every choice, shared between groups of the same shape."""

from dataclasses import dataclass, field, replace

from osdp_sim.costmodel.fast import (Config, RootCost, StepCost, group_shape, group_steps, root_steps, same_step_cost,
                                     seg)
from osdp_sim.costmodel.states import compute_bytes
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.spec import ModelSpec, OpGroup
from osdp_sim.plan.plan import GroupChoice, Plan


@dataclass(frozen=True)
class Option:
    """One choice for one group shape: its steps (forward order) and the sums the bounds use."""

    choice: GroupChoice
    steps: tuple[StepCost, ...]
    cf: float                     # forward compute
    af: float                     # forward (own) all-gathers
    fwd_in: float                 # forward segments between its own steps (exact)
    f_last: float                 # forward of its last step (its segment pairs with the next group)
    a_first: float                # its first step's own forward gather
    cb: float                     # backward compute, without recompute
    ab: float                     # backward communication: reductions + backward gathers
    opt: float                    # optimizer time
    res: float                    # resident bytes
    kept_act: float               # activations kept when the block is not checkpointed
    kept_gath: float              # gathered copies kept from forward to backward
    agz: float                    # backward gathers (units gathered again for backward)
    b_last: float                 # backward of its last step
    r_first: float                # reduction work after its first step
    z3: bool                      # some unit is gathered again for backward
    rc: float = 0.0               # recompute work when its block is checkpointed (cf if full)
    kept_sac: float = 0.0         # kept when its block is checkpointed, beyond the block's ck


def make_option(choice: GroupChoice, steps: tuple[StepCost, ...], s: float) -> Option:
    return Option(
        choice=choice, steps=steps,
        cf=sum(st.fwd_s for st in steps),
        af=sum(st.forward_gather_s or 0.0 for st in steps),
        fwd_in=sum(seg(a.fwd_s, b.forward_gather_s or 0.0, s) for a, b in zip(steps, steps[1:])),
        f_last=steps[-1].fwd_s,
        a_first=steps[0].forward_gather_s or 0.0,
        cb=sum(st.bwd_s for st in steps),
        ab=sum(w for st in steps for (w, *_rest) in (st.reduction_items or ())) + sum(st.backward_gather_s for st in steps if st.regathers),
        opt=sum(st.optimizer_s for st in steps),
        res=sum(st.resident_bytes for st in steps),
        kept_act=sum(st.act_bytes for st in steps),
        kept_gath=sum(st.gathered_bytes for st in steps if st.forward_gather_s is not None and not st.regathers),
        agz=sum(st.backward_gather_s for st in steps if st.regathers),
        b_last=steps[-1].bwd_s,
        r_first=sum(w for (w, *_r) in (steps[0].reduction_items or ())),
        z3=any(st.regathers for st in steps),
        rc=sum(st.recompute_s for st in steps),
        kept_sac=sum(st.sac_kept_bytes for st in steps))


@dataclass
class Block:
    index: int
    attn_shape: int
    mlp_shape: int
    ck: float                     # bytes a checkpointed block keeps
    sig: int                      # id of (attn shape, mlp shape, ck): blocks that are interchangeable


@dataclass
class Problem:
    spec: ModelSpec
    hw: HardwareProfile
    cfg: Config
    choices: tuple[GroupChoice, ...]
    ckpt_options: tuple[bool, ...]
    root: RootCost
    shapes: list[list[Option]]    # shape id -> options (index = choice index)
    shape_kinds: list[str]        # shape id -> "attn" | "mlp"
    blocks: list[Block]           # forward order
    keys: list[tuple[str, str]] = field(default_factory=list)   # block -> (attn key, mlp key)

    @property
    def m(self) -> int:
        return self.cfg.grad_accum

    @property
    def s(self) -> float:
        return self.hw.overlap_slowdown

    @property
    def samples(self) -> int:
        return self.cfg.micro_batch * self.cfg.grad_accum * self.cfg.devices

    def plan(self, attn: list[int], mlp: list[int], ckpt: list[bool]) -> Plan:
        choices = {"root": GroupChoice(self.cfg.root)}
        for b, (ka, km) in enumerate(self.keys):
            choices[ka] = self.choices[attn[b]]
            choices[km] = self.choices[mlp[b]]
        return self.cfg.plan(self.spec, choices, tuple(ckpt))


def same_costs(a: Problem, b: Problem) -> bool:
    """Whether every plan costs the same in both problems (time and memory, in the fold and in
    estimate()): their configurations differ at most in the root strategy, their group options
    and blocks are the same, and so are their root steps but for the strategy's name (a zero2
    and a zero3 root: fast.same_step_cost). The search runs the first of such twins for both."""
    return (replace(a.cfg, root="") == replace(b.cfg, root="") and a.choices == b.choices
            and a.ckpt_options == b.ckpt_options and a.blocks == b.blocks and a.shapes == b.shapes
            and same_step_cost(a.root.embed, b.root.embed) and same_step_cost(a.root.head, b.root.head))


def build_problem(spec: ModelSpec, hw: HardwareProfile, cfg: Config, choices: list[GroupChoice],
                  ckpt_options: tuple[bool, ...], cache: dict | None = None) -> Problem:
    """cache: shared between problems of the same spec and hardware (keyed by config too)."""
    cache = {} if cache is None else cache
    shape_ids: dict = {}
    shapes: list[list[Option]] = []
    kinds: list[str] = []
    sig_ids: dict = {}
    blocks: list[Block] = []
    keys = []
    cb = compute_bytes(cfg.precision)
    tokens = cfg.micro_batch * spec.seq_len
    ck_cfg = (cfg.devices, cfg.micro_batch, cfg.grad_accum, cfg.shard_group, cfg.precision, cfg.optimizer,
              cfg.selective)

    def shape_of(g: OpGroup) -> int:
        sh = group_shape(g)
        if sh not in shape_ids:
            ck = (ck_cfg, sh)
            if ck not in cache:
                cache[ck] = [make_option(c, group_steps(g, c, spec, hw, cfg), hw.overlap_slowdown) for c in choices]
            shape_ids[sh] = len(shapes)
            shapes.append(cache[ck])
            kinds.append(g.kind)
        return shape_ids[sh]

    for unit in spec.blocks:
        if len(unit.groups) != 2 or [g.kind for g in unit.groups] != ["attn", "mlp"]:
            raise ValueError(f"{unit.name}: the search expects an attention then an MLP group per block")
        attn, mlp = unit.groups
        a, m = shape_of(attn), shape_of(mlp)
        ck = (unit.sac_activations if cfg.selective else unit.ckpt_activations).bytes_for(cb, tokens)
        sig = sig_ids.setdefault((a, m, ck), len(sig_ids))
        blocks.append(Block(unit.index, a, m, ck, sig))
        keys.append((attn.plan_key, mlp.plan_key))
    root = root_steps(spec, hw, cfg)
    return Problem(spec, hw, cfg, tuple(choices), tuple(ckpt_options), root, shapes, kinds, blocks, keys)
