"""The OSDP paper's search, reimplemented cleanly: a multiple-choice knapsack DP over
(item, memory in 1 MiB steps, choice), run once per batch setting, keeping the plan of highest
throughput (the public prototype kept the smallest time per iteration, so it always picked the
smallest batch).

The DP needs an additive model: peak memory = base + sum of per-item memory, iteration time =
base + sum of per-item time. The items are the root group (embedding and head) and every
transformer block; a block's choice is (attention choice, MLP choice, checkpointed?). Per-item
costs come from the full cost model by differencing uniform plans (evaluated with fast_estimate,
which equals estimate() to ~1e-12), in one batch setting (micro-batch, accumulation, shard group):

  * reference plan R: every block on the first block choice, root on the reference root strategy;
    R at L and at L + 1 layers gives the marginal cost of one block, m_R = cost(L + 1) - cost(L),
    and the part that is no block's: base = cost_R(L) - L * m_R;
  * each block choice c: U_c = every block on c; its per-block cost is (cost(U_c) - base) / L, so
    the DP reproduces every uniform plan exactly;
  * each root choice r: cost(R with root r) - cost(R), shifted so that the cheapest is 0;
  * with the full choice set (784 block choices per checkpoint option at the default splits) a
    block choice (a, m) is composed from plans that change one group kind at a time ("separable",
    item_costs) instead of evaluating all 784 uniform plans.

Memory per item is rounded up to whole MiB (so the DP never under-counts the additive model), the
budget is rounded down. The real peak is a liveness maximum and the real time a two-stream
schedule, not sums, so the DP's plan is evaluated again with the full model: that is the result
reported, and a plan that the additive model thinks fits but the full model does not is
discarded. This module is the baseline and the benchmark opponent of the exact search (bnb.py).
"""

import itertools
import math
import time
from dataclasses import dataclass, field

import numpy as np

from osdp_sim.costmodel import Estimate, estimate
from osdp_sim.costmodel.fast import fast_estimate
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.spec import ModelSpec, build_spec
from osdp_sim.plan.plan import GroupChoice, Plan

MiB = 2**20
SEPARABLE_ABOVE = 128      # block choices above which "full" costs are composed one group kind at a time


@dataclass(frozen=True, order=True)
class BlockChoice:
    attn: GroupChoice
    mlp: GroupChoice
    checkpoint: bool = False

    def label(self) -> str:
        ck = ", checkpointed" if self.checkpoint else ""
        return f"attn {self.attn.label()}, mlp {self.mlp.label()}{ck}"


def paper_block_choices(checkpoint: bool = False) -> tuple[BlockChoice, ...]:
    """The paper's four per-block strategies: {attention sharded?} x {MLP sharded?}. Its
    "replicated" operator still sat inside the root FSDP wrapper, i.e. ZeRO-2, not DDP."""
    opts = (GroupChoice("zero2"), GroupChoice("zero3"))
    return tuple(BlockChoice(a, m, checkpoint) for a, m in itertools.product(opts, opts))


def full_block_choices(group_choices, checkpoint_options) -> tuple[BlockChoice, ...]:
    """Every (attention, MLP, checkpoint) combination of the search space's group choices."""
    return tuple(BlockChoice(a, m, bool(k)) for k in checkpoint_options
                 for a, m in itertools.product(group_choices, group_choices))


# ---------------------------------------------------------------- the DP itself

@dataclass(frozen=True)
class DPSolution:
    choices: tuple[int, ...]          # chosen index per item
    time_s: float                     # sum of the chosen items' times
    memory_mib: int                   # sum of the chosen items' weights
    best_time_by_budget_s: np.ndarray = field(repr=False, compare=False)   # final row: budget m -> best time


def knapsack_dp(weights_mib: list, times_s: list, budget_mib: int) -> DPSolution | None:
    """Multiple-choice knapsack: one choice per item, total weight <= budget_mib, least total time.

    f[m] = least time of the items so far with total weight at most m; each item replaces f by
    g[m] = min_c f[m - w_c] + t_c. O(items * budget * choices), vectorised over m. Returns None
    when no combination fits.
    """
    if budget_mib < 0:
        return None
    size = int(budget_mib) + 1
    f = np.zeros(size)
    picks = []
    for w_item, t_item in zip(weights_mib, times_s):
        w_item = np.asarray(w_item, dtype=np.int64)
        t_item = np.asarray(t_item, dtype=float)
        if (w_item < 0).any():
            raise ValueError("knapsack weights must be >= 0")
        g = np.full(size, np.inf)
        arg = np.full(size, -1, dtype=np.int32)
        for c, (w, t) in enumerate(zip(w_item, t_item)):
            if w >= size:
                continue
            cand = f[:size - w] + t
            better = cand < g[w:]
            g[w:][better] = cand[better]
            arg[w:][better] = c
        f = g
        picks.append(arg)
    if not np.isfinite(f[-1]):
        return None
    chosen = []
    m = size - 1
    for item in range(len(picks) - 1, -1, -1):
        c = int(picks[item][m])
        chosen.append(c)
        m -= int(np.asarray(weights_mib[item])[c])
    chosen.reverse()
    used = sum(int(np.asarray(weights_mib[i])[c]) for i, c in enumerate(chosen))
    total = sum(float(np.asarray(times_s[i])[c]) for i, c in enumerate(chosen))
    return DPSolution(tuple(chosen), total, used, f)


# ---------------------------------------------------------------- costs from the cost model

@dataclass(frozen=True)
class Setting:
    """Everything a plan fixes besides the per-group choices: one iteration of the batch loop."""

    devices: int
    micro_batch: int
    grad_accum: int
    shard_group: int
    precision: str
    optimizer: str

    @property
    def samples_per_step(self) -> int:
        return self.devices * self.micro_batch * self.grad_accum


def make_plan(spec: ModelSpec, setting: Setting, root: str, blocks) -> Plan:
    """A plan from one root strategy and one BlockChoice per block (a sequence, or one for all)."""
    n = spec.config.n_layers
    if isinstance(blocks, BlockChoice):
        blocks = [blocks] * n
    choices = {"root": GroupChoice(root)}
    for i, b in enumerate(blocks):
        choices[f"block{i}.attn"] = b.attn
        choices[f"block{i}.mlp"] = b.mlp
    return Plan(model=spec.config, devices=setting.devices, micro_batch=setting.micro_batch,
                choices=choices, checkpoint=tuple(b.checkpoint for b in blocks),
                grad_accum=setting.grad_accum, precision=setting.precision,
                optimizer=setting.optimizer, shard_group=setting.shard_group)


@dataclass(frozen=True)
class ItemCosts:
    """The additive model of one setting: base + per-item costs (item 0 is the root)."""

    base_bytes: float
    base_s: float
    weights_mib: list                 # per item: array over its choices
    times_s: list
    root_choices: tuple[str, ...]
    block_choices: tuple[BlockChoice, ...]
    estimates: int                    # cost-model calls it took


def _cost(spec: ModelSpec, hw: HardwareProfile, plan: Plan) -> tuple[float, float]:
    """(peak bytes, iteration seconds) of one plan: fast_estimate, which equals estimate() to
    about 1e-12 and is several times faster on split plans."""
    e = fast_estimate(spec, hw, plan)
    return e.peak_memory_bytes, e.iteration_time_s


def item_costs(spec: ModelSpec, hw: HardwareProfile, setting: Setting,
               block_choices: tuple[BlockChoice, ...], root_choices: tuple[str, ...], *,
               separable: bool = False) -> ItemCosts:
    """The additive model of one setting (module docstring). separable=True derives a block
    choice (a, m, k) from plans that change one group kind at a time, cost(a, m, k) =
    cost(a, ref, k) + cost(ref, m, k) - cost(ref, ref, k), so a choice set of A x M x K block
    choices costs A + M probes per checkpoint option instead of A x M (the "full" set: 56 instead
    of 784); it is exact on uniform plans that differ from the reference in one group kind."""
    n = spec.config.n_layers
    ref_root = "zero3" if "zero3" in root_choices else root_choices[0]
    ref_block = block_choices[0]
    longer = build_spec(with_overrides(spec.config, n_layers=n + 1))
    ref_b, ref_t = _cost(spec, hw, make_plan(spec, setting, ref_root, ref_block))
    long_b, long_t = _cost(longer, hw, make_plan(longer, setting, ref_root, ref_block))
    base_b = ref_b - n * (long_b - ref_b)
    base_t = ref_t - n * (long_t - ref_t)
    calls = 2
    memo = {ref_block: (ref_b, ref_t)}

    def uniform(c: BlockChoice) -> tuple[float, float]:
        nonlocal calls
        if c not in memo:
            memo[c] = _cost(spec, hw, make_plan(spec, setting, ref_root, c))
            calls += 1
        return memo[c]

    block_b, block_t = [], []
    for c in block_choices:
        if separable:
            ra, rm = ref_block.attn, ref_block.mlp
            parts = [uniform(BlockChoice(c.attn, rm, c.checkpoint)), uniform(BlockChoice(ra, c.mlp, c.checkpoint)),
                     uniform(BlockChoice(ra, rm, c.checkpoint))]
            total_b = parts[0][0] + parts[1][0] - parts[2][0]
            total_t = parts[0][1] + parts[1][1] - parts[2][1]
        else:
            total_b, total_t = uniform(c)
        block_b.append((total_b - base_b) / n)
        block_t.append((total_t - base_t) / n)
    root_b, root_t = [], []
    for r in root_choices:
        if r == ref_root:
            b_, t_ = ref_b, ref_t
        else:
            b_, t_ = _cost(spec, hw, make_plan(spec, setting, r, ref_block))
            calls += 1
        root_b.append(b_ - ref_b)
        root_t.append(t_ - ref_t)
    # Shift so every item's cheapest choice weighs >= 0 (the DP's weights are memory amounts).
    shift_root = min(root_b)
    shift_block = min(0.0, min(block_b))
    base_b += shift_root + n * shift_block
    w_root = np.ceil((np.array(root_b) - shift_root) / MiB).astype(np.int64)
    w_block = np.ceil((np.array(block_b) - shift_block) / MiB).astype(np.int64)
    return ItemCosts(base_b, base_t, [w_root] + [w_block] * n, [np.array(root_t)] + [np.array(block_t)] * n,
                     tuple(root_choices), tuple(block_choices), calls)


# ---------------------------------------------------------------- the batch loop

@dataclass(frozen=True)
class Candidate:
    """The DP's answer for one setting, with its additive prediction and its true estimate."""

    setting: Setting
    plan: Plan | None
    dp_memory_bytes: float | None
    dp_time_s: float | None
    estimate: Estimate | None
    fits: bool

    @property
    def samples_per_s(self) -> float:
        return self.estimate.samples_per_s if self.estimate else 0.0


def pick_best(candidates: list[Candidate]) -> Candidate | None:
    """The fixed batch loop: the candidate of highest throughput that fits (not the least time
    per iteration, which favours the smallest batch)."""
    fitting = [c for c in candidates if c.fits]
    return max(fitting, key=lambda c: c.samples_per_s, default=None)


@dataclass(frozen=True)
class KnapsackResult:
    status: str                       # optimal-for-its-model ("solved") | "infeasible"
    plan: Plan | None
    estimate: Estimate | None
    candidates: tuple[Candidate, ...]
    seconds: float                    # whole search: cost derivation + DPs + re-evaluation
    dp_seconds: float                 # the DPs alone
    estimates: int                    # cost-model calls (fast_estimate probes + estimate() re-evaluations)
    choice_set: str                   # paper | full
    choices_per_block: int
    cut_short: bool = False           # the deadline passed before every batch setting was solved

    @property
    def feasible(self) -> bool:
        return self.plan is not None


def solve_setting(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, setting: Setting,
                  block_choices, root_choices, *, separable: bool = False) -> tuple[Candidate, int, float]:
    """One DP for one setting: (candidate, cost-model calls, seconds in the DP)."""
    costs = item_costs(spec, hw, setting, block_choices, root_choices, separable=separable)
    budget = math.floor((mem_limit_bytes - costs.base_bytes) / MiB)
    t0 = time.perf_counter()
    sol = knapsack_dp(costs.weights_mib, costs.times_s, budget)
    dp_s = time.perf_counter() - t0
    if sol is None:
        return Candidate(setting, None, None, None, None, False), costs.estimates, dp_s
    root = costs.root_choices[sol.choices[0]]
    blocks = [costs.block_choices[c] for c in sol.choices[1:]]
    plan = make_plan(spec, setting, root, blocks)
    est = estimate(spec, hw, plan)
    return (Candidate(setting, plan, costs.base_bytes + sol.memory_mib * MiB, costs.base_s + sol.time_s,
                      est, est.peak_memory_bytes <= mem_limit_bytes),
            costs.estimates + 1, dp_s)


def knapsack_search(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, settings,
                    block_choices, root_choices, *, choice_set: str = "paper",
                    separable: bool = False) -> KnapsackResult:
    """Run the DP for every setting (the batch loop) and keep the fitting plan of highest
    throughput by the full model."""
    t0 = time.perf_counter()
    cands, calls, dp_s = [], 0, 0.0
    for s in settings:
        c, k, d = solve_setting(spec, hw, mem_limit_bytes, s, tuple(block_choices), tuple(root_choices),
                                separable=separable)
        cands.append(c)
        calls += k
        dp_s += d
    best = pick_best(cands)
    return KnapsackResult("solved" if best else "infeasible", best.plan if best else None,
                          best.estimate if best else None, tuple(cands), time.perf_counter() - t0,
                          dp_s, calls, choice_set, len(block_choices))


# ---------------------------------------------------------------- from a search space

MAX_AUTO_MICRO_BATCH = 4096


def micro_batch_candidates(space, hw: HardwareProfile) -> tuple[list[int], bool]:
    """(micro-batches in increasing order, auto?). Auto (space.micro_batches None) means 1, 2,
    3, ... until nothing fits: the caller stops at the first micro-batch where nothing does."""
    from osdp_sim.planner.space import devices_of
    if space.micro_batches is not None:
        return sorted(set(space.micro_batches)), False
    top = min(space.global_batch // devices_of(space, hw), MAX_AUTO_MICRO_BATCH) if space.global_batch \
        else MAX_AUTO_MICRO_BATCH
    return list(range(1, max(1, top) + 1)), True


def settings_for(space, hw: HardwareProfile, micro_batch: int) -> list[Setting]:
    """The batch settings of the space at one micro-batch: one per shard group, none when the
    micro-batch does not divide the global batch."""
    from osdp_sim.planner.space import devices_of, grad_accum_of, shard_groups_of
    devices = devices_of(space, hw)
    accum = grad_accum_of(space, micro_batch, devices)
    if accum is None:
        return []
    return [Setting(devices, micro_batch, accum, g, space.precision, space.optimizer)
            for g in shard_groups_of(space, hw, devices)]


def space_settings(space, hw: HardwareProfile) -> list[Setting]:
    """Every batch setting of a space with explicit micro-batches."""
    mbs, auto = micro_batch_candidates(space, hw)
    if auto:
        raise ValueError("the space searches micro-batches up to what fits; enumerate them with "
                         "micro_batch_candidates() and stop at the first that does not fit")
    return [s for mb in mbs for s in settings_for(space, hw, mb)]


def checkpoint_options(space) -> tuple[bool, ...]:
    return tuple(bool(c) for c in space.checkpoint)


def osdp_knapsack(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space, *,
                  choices: str = "paper", separable: bool | None = None,
                  deadline: float | None = None) -> KnapsackResult:
    """The OSDP DP over a search space's batch settings (micro-batches up to the first at which
    the DP finds nothing, when the space leaves them open). choices="paper": the paper's four
    {attention, MLP} x {zero2, zero3} block strategies, each with checkpointing on or off as the
    space allows (the prototype had no checkpointing; Galvatron adds it per layer, and without it
    the DP would lose to uniform ZeRO-3 with checkpointing at any larger batch); "full": every
    (attention, MLP, checkpoint) combination of the space's group choices (the benchmark against
    the exact search); above SEPARABLE_ABOVE block choices (the 28-choice space: 1,568) the
    per-block costs are composed one group kind at a time (item_costs, separable=True), which
    is exact on uniform plans only; below it every block choice is probed. The root takes the
    space's root strategies. separable: force (True) or forbid (False) the composition; None
    decides by the number of block choices. Micro-batches stop once no larger one can beat the
    best plan so far (mbbound.py's bound; the answer is the same); deadline
    (time.perf_counter()): stop then with the best so far (cut_short)."""
    from osdp_sim.planner.baselines import suffix_bound
    from osdp_sim.planner.space import group_choices
    ck = checkpoint_options(space)
    if choices == "paper":
        blocks = tuple(b for k in ck for b in paper_block_choices(checkpoint=k))
    elif choices == "full":
        blocks = full_block_choices(tuple(group_choices(space)), ck)
    else:
        raise ValueError(f"choices must be 'paper' or 'full', not {choices!r}")
    compose = (choices == "full" and len(blocks) > SEPARABLE_ABOVE) if separable is None else separable
    t0 = time.perf_counter()
    cands, calls, dp_s = [], 0, 0.0
    mbs, auto = micro_batch_candidates(space, hw)
    beyond = suffix_bound(spec, hw, space, mem_limit_bytes, mbs)
    cut = False
    for mb in mbs:
        best = pick_best(cands)
        if best is not None and beyond(mb) <= best.samples_per_s:
            break
        if deadline is not None and time.perf_counter() > deadline:
            cut = True
            break
        found = False
        for s in settings_for(space, hw, mb):
            c, k, d = solve_setting(spec, hw, mem_limit_bytes, s, blocks, space.roots,
                                    separable=compose)
            cands.append(c)
            calls += k
            dp_s += d
            found = found or c.plan is not None
        if auto and not found and settings_for(space, hw, mb):
            break
    best = pick_best(cands)
    return KnapsackResult("solved" if best else "infeasible", best.plan if best else None,
                          best.estimate if best else None, tuple(cands), time.perf_counter() - t0,
                          dp_s, calls, choices, len(blocks), cut_short=cut)
