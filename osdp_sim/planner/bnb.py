"""search(): the plan of highest samples/s whose estimate() peak memory fits, proven optimal.

Outer loop: one configuration per (micro-batch, gradient accumulation, shard group, root
strategy). Each gets an upper bound on its samples/s from the bounds at its first decision
(bounds.py) and a memory lower bound; configurations are searched best bound first, and one
whose bound cannot beat the k-th best plan found so far is skipped, proven. Inner search: the
exact label-setting DP of dp.py, pruned by the incumbent; a beam run of the same DP on the most
promising configurations supplies that incumbent first. docs/search.md has the argument.
"""

import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

import numpy as np

from osdp_sim.costmodel import Estimate, estimate
from osdp_sim.costmodel.fast import MEM_Q, TIME_Q, Config, start_label, total_peak_bytes
from osdp_sim.errors import UserError
from osdp_sim.hardware.profile import HardwareProfile
from osdp_sim.jitwarm import FRONT_ENTRY_POINTS, warm_in_background
from osdp_sim.model.spec import ModelSpec
from osdp_sim.plan.plan import Plan
from osdp_sim.planner.dp import Engine, Finished
from osdp_sim.planner.front import FrontStairs
from osdp_sim.planner.keygraph import GraphCaps
from osdp_sim.planner.keystore import KeyStore
from osdp_sim.planner.mbbound import MicroBatchBounds, floors, least_resident_bytes, micro_batch_bounds
from osdp_sim.planner.problem import Problem, build_problem, same_costs
from osdp_sim.planner.result import (STATUSES, EvaluatedPlan, MicroBatchOutcome, OpenConfig, SearchResult,
                                    TopPlan)
from osdp_sim.planner.space import (SearchSpace, checkpoint_variants, devices_of, grad_accum_of,
                                   shard_groups_of)
from osdp_sim.planner.tuning import SearchTuning

TUNING = SearchTuning()                   # search()'s default tuning (tuning.py), read at each call
EVALUATED_CAP = 20000                     # complete plans kept in SearchResult.evaluated (a scatter, not a proof)
MAX_MICRO_BATCH = 4096                    # micro-batches beyond are not listed without --micro-batch
# search()'s default time limit, also the CLI's (osdp-sim search --time-limit): on communication-
# bound rigs (PCIe) the exact search can take minutes on 48-layer models with the full space
# (docs/search.md, "Performance and known limits"); by default it stops and reports the proven gap.
DEFAULT_TIME_LIMIT_S = 60.0
DEFAULT_PARETO_TIME_LIMIT_S = 600.0        # a front is many searches (osdp-sim pareto's default too)
FIXED_POINT_MAX = 2 ** 60                 # the stage tables are int64 (fast.MEM_Q, TIME_Q units)


def beam_width(c: "_Cfg", tuning: SearchTuning) -> int:
    """The beam for this configuration's problem: tuning.beam wide on models up to about
    beam_labels / beam decisions, narrower beyond, never below min_beam (tuning.py)."""
    return max(tuning.min_beam, min(tuning.beam, tuning.beam_labels // max(1, len(c.engine.positions))))


@dataclass
class ParetoResult:
    front: list                          # [(peak_bytes, samples_per_s, Plan)], peak ascending
    evaluated: list                      # [(peak_bytes, samples_per_s)]
    seconds: float
    nodes: int
    proven: bool = True                  # False: a deadline stopped it (the front is of what was searched)


@dataclass
class _Cfg:
    config: Config
    problem: Problem
    mem_lb_q: float                      # least possible live-byte peak (fixed point)
    engine: Engine | None = None
    ub_sps: float = math.inf
    twins: list = field(default_factory=list)   # later configurations of the same costs (same_costs):
                                                # never searched, they get a copy of each plan of this one


def merge_twins(cfgs: list) -> list:
    """The configurations none earlier in the list costs the same as (problem.same_costs: a zero2
    and a zero3 root); each later twin goes to its first's `twins`. Their searches would be the
    same, so only the first runs."""
    firsts: dict = {}
    out = []
    for c in cfgs:
        same = firsts.setdefault(replace(c.config, root=""), [])
        first = next((f for f in same if same_costs(f.problem, c.problem)), None)
        if first is None:
            same.append(c)
            out.append(c)
        else:
            first.twins.append(c)
    return out


@dataclass
class _MicroBatchState:
    """What one search() run knows of a micro-batch (SearchResult.per_micro_batch)."""

    best_samples_per_s: float | None = None   # the best plan found with it (None: none)
    bound_only: bool = True                   # no configuration of it was searched: ruled out by bounds


@dataclass(frozen=True)
class Found:
    """A plan that fits, found by one search() run (the incumbent and the top-k)."""

    samples_per_s: float                 # its throughput (from the fixed-point label)
    peak_bytes: float                    # its estimate() peak memory
    order: int                           # how many plans were kept before it: ties go to the first found
    cfg: _Cfg                            # its configuration
    finished: Finished                   # its choices and fixed-point (time, peak)
    plan_key: tuple                      # (Config, attention, MLP and checkpoint choices): the same plan twice


def _limit_q(limit_bytes: float, hw: HardwareProfile) -> int:
    """Largest live-byte peak (fixed point) whose total estimate() peak fits the limit."""
    if not math.isfinite(limit_bytes):
        return 2 ** 62
    q = int((limit_bytes - hw.memory.context_bytes) / (1.0 + hw.memory.fragmentation) / MEM_Q) + 2
    while q > 0 and total_peak_bytes(q, hw) > limit_bytes:
        q -= 1
    return max(q, -1)


def _progress(msg: str, enabled: bool) -> None:
    if enabled:
        print(msg, file=sys.stderr, flush=True)


def _mem_lb_q(pb: Problem) -> float:
    """U at the start + the least resident + kept bytes of every group and the embedding."""
    _key, lab = start_label(pb.root.head, pb.m, pb.s)
    allow_nc, allow_ck = False in pb.ckpt_options, True in pb.ckpt_options
    tot = lab.u + (pb.root.embed.act_bytes + pb.root.embed.gathered_bytes) / MEM_Q
    for b in pb.blocks:
        a, m = pb.shapes[b.attn_shape], pb.shapes[b.mlp_shape]
        vals = []
        if allow_nc:
            vals.append(min(o.res + o.kept_act + o.kept_gath for o in a) + min(o.res + o.kept_act + o.kept_gath for o in m))
        if allow_ck:
            vals.append(min(o.res + o.kept_gath + o.kept_sac for o in a)
                        + min(o.res + o.kept_gath + o.kept_sac for o in m) + b.ck)
        tot += min(vals) / MEM_Q
    return tot - 64.0 * (len(pb.blocks) + 2)


def _configs(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace, pq_max: int, cache: dict,
             deadline: float | None = None):
    """Configurations in a fixed order, with micro-batches up to the largest at which the
    memory lower bound still fits (the bound grows with the micro-batch); up to the deadline
    (time.perf_counter()) if one is given."""
    devices = devices_of(space, hw)
    groups = shard_groups_of(space, hw, devices)
    variants = checkpoint_variants(space, spec)
    out = []
    mbs = space.micro_batches
    mb = 1
    while True:
        if mbs is not None:
            if mb > max(mbs):
                break
            if mb not in mbs:
                mb += 1
                continue
        elif mb > MAX_MICRO_BATCH:
            break
        if deadline is not None and time.perf_counter() > deadline:
            break
        m = grad_accum_of(space, mb, devices)
        fits_any = False
        if m is not None:
            for sg in groups:
                for root, v in ((r, v) for r in space.roots for v in variants):
                    cfg = Config(devices, mb, m, sg, space.precision, space.optimizer, root, v.selective)
                    pb = build_problem(spec, hw, cfg, v.choices, v.options, cache)
                    lb = _mem_lb_q(pb)
                    fits_any |= lb <= pq_max
                    out.append(_Cfg(cfg, pb, lb))
        if mbs is None and m is not None and not fits_any:
            break
        if mbs is None and space.global_batch is not None and mb * devices > space.global_batch:
            break
        mb += 1
    return out


def _finished_value(pb: Problem, f: Finished, hw: HardwareProfile) -> tuple[float, float]:
    it_s = f.t_q * TIME_Q
    return total_peak_bytes(f.peak_q, hw), pb.samples / it_s


def search(spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space: SearchSpace = SearchSpace(),
           *, time_limit_s: float | None = DEFAULT_TIME_LIMIT_S, top_k: int = 1,
           progress: bool = False, cache: dict | None = None, graph_caps: GraphCaps = GraphCaps(),
           rel_gap: float = 0.0, tuning: SearchTuning | None = None) -> SearchResult:
    """The plan with the highest samples/s whose estimate() peak memory is <= mem_limit_bytes.

    time_limit_s: stop then with the best plan found and a proven bound on anything better
    (default DEFAULT_TIME_LIMIT_S; None: run until optimal).
    graph_caps: how large a configuration's key graph may grow (keygraph.py) before the search
    falls back to the relaxed bounds for it; larger caps prove more configurations, at a cost.
    rel_gap: stop proving once no plan can beat the best found by more than this fraction (a
    branch-and-bound's relative gap tolerance, as scipy.optimize.milp's mip_rel_gap): whatever
    could only beat it by less is pruned; the result is "within_gap" with that gap certified.
    cache: a dict shared by calls with the same spec, hw and space (a sweep over limits): the
    cost tables and the engines' stage tables are kept in it, so later calls reuse them.
    tuning: how much work each phase spends before the next (tuning.py; None: bnb.TUNING); it
    changes how soon a result comes, never what is proven."""
    if top_k < 1:
        raise UserError("top_k must be at least 1", field="top_k")
    if not 0.0 <= rel_gap < 1.0:
        raise UserError(f"the gap tolerance must be at least 0 and below 1; got {rel_gap}", field="rel_gap")
    check_time_limit(time_limit_s, "time_limit_s")
    warm_in_background()
    try:
        return _search(spec, hw, mem_limit_bytes, space, time_limit_s, top_k, progress, cache, graph_caps, rel_gap,
                       TUNING if tuning is None else tuning)
    except OverflowError:
        raise UserError(f"{spec.name} on {hw.name} is beyond the search's fixed-point range (iteration times "
                        f"up to about {2 ** 62 * TIME_Q:.0f} s, peaks up to {2 ** 62 * MEM_Q / 2 ** 50:.0f} PiB); "
                        "try smaller micro-batches (--micro-batch), a smaller --global-batch or a smaller "
                        "model") from None


def _search(spec, hw, mem_limit_bytes, space, time_limit_s, top_k, progress, cache, graph_caps, rel_gap, tuning):
    """The phases, in order: list the first round of configurations with their bounds; seed the
    incumbent (uniform plans, then the optimum of the nested space without splits); then, round
    by round, prove the listed configurations (_Search.prove: bounds, beams, probes or key
    graphs, exact searches) and list the micro-batches whose bound still beats the incumbent."""
    t0 = time.perf_counter()
    cache = {} if cache is None else cache
    s = _Search(hw=hw, pq_max=_limit_q(mem_limit_bytes, hw), top_k=top_k, rel_gap=rel_gap, t0=t0,
                deadline=None if time_limit_s is None else t0 + time_limit_s, progress=progress,
                graph_caps=graph_caps, tuning=tuning)
    problems, engines = cache.setdefault("problems", {}), cache.setdefault("engines", {})
    lister = _Lister(spec, hw, space, s, problems, engines, cache.setdefault("keys", KeyStore()))
    fitting = lister.first_round()
    s.say(f"{len(lister.cfgs)} configurations at {len(lister.listed)} of {len(lister.bounds.micro_batches)} "
          f"micro-batches, {len(fitting) + lister.twins} may fit"
          + (f", {lister.twins} of them searched with a twin (the same costs, another root strategy)"
             if lister.twins else ""))

    # the incumbent: uniform plans, the optimum of the nested space without splits (a plan of
    # this space too), then beam runs on the most promising configurations
    order = _by_bound(fitting)
    s.uniform_plans(order[:tuning.uniform_configs], time_limit_s)
    if any(k > 1 for k in space.splits) and lister.bounds.fits().any() and not s.expired():
        left = None if s.deadline is None else \
            max(0.0, (s.deadline - time.perf_counter()) * tuning.unsplit_time_fraction)
        sub = search(spec, hw, mem_limit_bytes, replace(space, splits=(1,)), time_limit_s=left, top_k=top_k,
                     cache=cache.setdefault("unsplit", {}), graph_caps=graph_caps, rel_gap=rel_gap, tuning=tuning)
        fitting += s.add_plans(sub, lister)
    order = fitting
    while order:
        s.prove(order)
        if s.open_bounds:
            break
        order = lister.next_round()                 # micro-batches whose bound still beats the incumbent
    lister.close(s)
    return s.result(spec, hw, mem_limit_bytes, space, lister, problems)


def check_time_limit(seconds: float | None, field: str) -> None:
    """None (no limit) or a finite number of seconds >= 0."""
    if seconds is not None and not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds >= 0):
        raise UserError(f"expected a finite number of seconds >= 0, got {seconds}", field=field)


def _by_bound(cfgs: list) -> list:
    return sorted(cfgs, key=lambda c: (-c.ub_sps, c.config.micro_batch, c.config.shard_group, c.config.root))


class _Lister:
    """The configurations of the space, listed lazily by micro-batch: the closed-form bound of
    mbbound.py says which micro-batches could still beat the incumbent; a round lists the next
    of them, best bound first, and the search proves them before the next round. The first
    round takes every micro-batch when there are few, else the powers of two and the best bounds
    (SearchTuning.first_round_micro_batches, round_micro_batches)."""

    def __init__(self, spec, hw, space, s, problems: dict, engines: dict, keys: KeyStore):
        self.spec, self.hw, self.space, self.s = spec, hw, space, s
        self.problems, self.engines, self.keys = problems, engines, keys
        self.devices = devices_of(space, hw)
        self.groups = shard_groups_of(space, hw, self.devices)
        self.variants = checkpoint_variants(space, spec)
        self.cfgs: list = []                  # every configuration listed
        self.fitting: list = []               # ... whose memory lower bound fits
        self.by_cfg: dict = {}                # Config -> its _Cfg, of those (a twin's: its first's)
        self.twins = 0                        # fitting configurations searched as another's twin
        self.listed: set = set()              # micro-batches listed
        self.round = s.tuning.round_micro_batches
        self.bounds = self._bounds()
        self.ub = dict(zip(self.bounds.micro_batches.tolist(), self.bounds.ub_samples_per_s.tolist()))
        self.unlisted_open: list = []         # (micro-batch, bound) left when the deadline passed

    def _bounds(self) -> MicroBatchBounds:
        mbs = candidate_micro_batches(self.space, self.devices)
        if not mbs:
            return MicroBatchBounds(np.zeros(0, dtype=np.int64), np.zeros(0))
        floor = floors(self.spec, self.hw, self.space, self.problems)
        b = micro_batch_bounds(self.spec, self.hw, self.space, mbs, self.s.pq_max, floor)
        keep = b.fits()
        if self.space.micro_batches is None and self.space.global_batch is None and keep.any():
            # the memory lower bound grows with the micro-batch: the largest that may fit, by bisection
            lo, hi = 0, int(np.flatnonzero(keep)[-1])
            if self._mem_lb_fits(int(b.micro_batches[hi])):
                lo = hi + 1
            while lo < hi:
                mid = (lo + hi) // 2
                if self._mem_lb_fits(int(b.micro_batches[mid])):
                    lo = mid + 1
                else:
                    hi = mid
            keep &= np.arange(len(keep)) < lo
        return MicroBatchBounds(b.micro_batches[keep], b.ub_samples_per_s[keep])

    def _problems(self, mb: int) -> list:
        m = grad_accum_of(self.space, mb, self.devices)
        out = []
        for sg in self.groups:
            for root, v in ((r, v) for r in self.space.roots for v in self.variants):
                cfg = Config(self.devices, mb, m, sg, self.space.precision, self.space.optimizer, root,
                             v.selective)
                pb = build_problem(self.spec, self.hw, cfg, v.choices, v.options, self.problems)
                out.append(_Cfg(cfg, pb, _mem_lb_q(pb)))
        return out

    def _mem_lb_fits(self, mb: int) -> bool:
        return any(c.mem_lb_q <= self.s.pq_max for c in self._problems(mb))

    def _list(self, mbs) -> list:
        """The fitting configurations of these micro-batches with their bounds; stops at the deadline."""
        out = []
        for mb in mbs:
            if self.s.expired():
                break
            self.listed.add(mb)
            cs = self._problems(mb)
            self.cfgs += cs
            if cs:
                self.s.per_mb.setdefault(mb, _MicroBatchState())
            for c in merge_twins([c for c in cs if c.mem_lb_q <= self.s.pq_max]):
                if c.config not in self.engines:
                    self.engines[c.config] = Engine(c.problem, self.keys)
                c.engine = self.engines[c.config]
                c.problem = c.engine.pb
                c.ub_sps = _config_ub(c, self.s.pq_max)
                self.s.global_ub = max(self.s.global_ub, c.ub_sps)
                self.fitting.append(c)
                self.by_cfg[c.config] = c
                self.by_cfg.update((t.config, c) for t in c.twins)
                self.twins += len(c.twins)
                out.append(c)
        return out

    def _open(self) -> list:
        """Micro-batches not listed whose bound beats the incumbent, best bound first."""
        goal = self.s.goal()
        left = [(ub, mb) for mb, ub in self.ub.items() if mb not in self.listed and ub > goal]
        return [mb for _ub, mb in sorted(left, key=lambda x: (-x[0], x[1]))]

    def first_round(self) -> list:
        mbs = self.bounds.micro_batches.tolist()
        if len(mbs) > self.s.tuning.first_round_micro_batches:
            powers = [mb for mb in mbs if mb & (mb - 1) == 0]
            mbs = sorted(set(powers + self._open()[:self.s.tuning.round_micro_batches]))
        return self._list(mbs)

    def next_round(self) -> list:
        mbs = self._open()[:self.round]
        self.round *= 2
        if mbs:
            self.s.say(f"incumbent {self.s.kth_best():.4g} samples/s: {len(self._open())} more micro-batches "
                       f"may beat it, listing {len(mbs)} (bounds up to {self.ub[mbs[0]]:.4g} samples/s)")
        return self._list(mbs)

    def also(self, mb: int) -> list:
        """The configurations of one more micro-batch (a plan found elsewhere uses it)."""
        return [] if mb in self.listed or mb not in self.ub else self._list([mb])

    def close(self, s) -> None:
        """What was never listed: ruled out by its bound, or open when the search stopped."""
        goal = s.goal()
        self.unlisted_open = [(mb, ub) for mb, ub in self.ub.items() if mb not in self.listed and ub > goal]
        # rounds go on while some micro-batch may beat the incumbent: any left means it stopped
        s.open_bounds.extend(ub for _mb, ub in self.unlisted_open)
        s.global_ub = max([s.global_ub] + [ub for mb, ub in self.ub.items() if mb not in self.listed])


def candidate_micro_batches(space: SearchSpace, devices: int) -> list[int]:
    """The micro-batches of the space: the listed ones, those that divide the global batch, or
    1 .. MAX_MICRO_BATCH (the bounds of mbbound.py rule out what cannot fit)."""
    if space.micro_batches is not None:
        mbs = sorted(set(space.micro_batches))
    elif space.global_batch is not None:
        mbs = range(1, min(space.global_batch // devices, MAX_MICRO_BATCH) + 1)
    else:
        mbs = range(1, MAX_MICRO_BATCH + 1)
    return [mb for mb in mbs if grad_accum_of(space, mb, devices) is not None]


class _Search:
    """One search() run: the plans found (the incumbent), the bounds left open, the counters,
    and its phases after the configuration bounds, in the order search() calls them."""

    def __init__(self, *, hw: HardwareProfile, pq_max: int, top_k: int, rel_gap: float, t0: float, deadline: float | None,
                 progress: bool, graph_caps: GraphCaps, tuning: SearchTuning):
        self.hw, self.pq_max, self.top_k, self.rel_gap = hw, pq_max, top_k, rel_gap
        self.t0, self.deadline, self.progress, self.graph_caps = t0, deadline, progress, graph_caps
        self.tuning = tuning
        self.found: list[Found] = []         # best first: most samples/s, then least peak, then first found
        self.evaluated: list[EvaluatedPlan] = []
        self.per_mb: dict[int, _MicroBatchState] = {}
        self.open_bounds: list[float] = []   # bounds of what a deadline left unsearched
        self.over_caps: set = set()          # configurations whose key graph passed the caps
        self.nodes = self.leaves = self.searched = 0
        self.global_ub = 0.0

    # -- the incumbent ---------------------------------------------------------------------------

    def kth_best(self) -> float:
        if len(self.found) < self.top_k:
            return 0.0
        return sorted((f.samples_per_s for f in self.found), reverse=True)[self.top_k - 1]

    def goal(self) -> float:
        """What a plan must beat to be searched for: the k-th best so far, raised by rel_gap."""
        return self.kth_best() * (1.0 + self.rel_gap)

    def add(self, c: _Cfg, fins: list) -> None:
        """Plans of c (and the same plans of its twins, which cost the same) evaluated."""
        for f in fins:
            peak, sps = _finished_value(c.problem, f, self.hw)
            self.leaves += 1
            if len(self.evaluated) < EVALUATED_CAP:
                self.evaluated.append(EvaluatedPlan(peak, sps))
            if f.peak_q <= self.pq_max:
                for x in (c, *c.twins):
                    key = (x.config, tuple(f.attn), tuple(f.mlp), tuple(f.ckpt))
                    if all(k.plan_key != key for k in self.found):
                        self.found.append(Found(sps, peak, len(self.found), x, f, key))
        self.found.sort(key=lambda x: (-x.samples_per_s, x.peak_bytes, x.order))
        del self.found[max(self.top_k, 1) * 4:]

    def run(self, c: _Cfg, best_k: float, **kw):
        """The inner search (dp.Engine.run) of c for plans beating best_k within this run's limit and
        deadline; its nodes counted and its plans added."""
        r = c.engine.run(pq_max=self.pq_max, thr_q=_thr_q(c, best_k), deadline=self.deadline, **kw)
        self.nodes += r.stats.nodes
        self.add(c, r.finished)
        return r

    def uniform_plans(self, cfgs: list, time_limit_s: float | None) -> None:
        """Every uniform plan (one choice everywhere) of these configurations, within
        SearchTuning.uniform_time_fraction of the time limit."""
        until = None if self.deadline is None else self.t0 + self.tuning.uniform_time_fraction * time_limit_s
        for c in cfgs:
            if until is not None and time.perf_counter() > until:
                break
            self.add(c, _uniform_finished(c.problem, c.engine))

    def add_plans(self, sub: SearchResult, lister: "_Lister") -> list:
        """The plans of a search of a nested space (without splits), which are plans of this one.
        Returns the configurations listed for them (their micro-batch was not listed yet)."""
        self.nodes += sub.nodes
        added = []
        for ranked in sub.top:
            plan = ranked.plan
            cfg = Config(plan.devices, plan.micro_batch, plan.grad_accum, plan.shard_size,
                         plan.precision, plan.optimizer, plan.choices["root"].strategy,
                         any(plan.selective))
            if cfg not in lister.by_cfg:
                added += lister.also(plan.micro_batch)
            c = lister.by_cfg.get(cfg)
            if c is None:
                continue
            idx = {ch: i for i, ch in enumerate(c.problem.choices)}
            if any(plan.choices[k] not in idx for ks in c.problem.keys for k in ks):
                continue
            attn = [idx[plan.choices[ka]] for ka, _km in c.problem.keys]
            mlp = [idx[plan.choices[km]] for _ka, km in c.problem.keys]
            t_q, peak_q = c.engine.path_end(attn, mlp, list(plan.checkpoint))
            self.add(c, [Finished(t_q, peak_q, attn, mlp, list(plan.checkpoint))])
        return added

    def prove(self, fitting: list) -> None:
        """Bounds, beams, probes and exact searches of these configurations (one round)."""
        order = _by_bound(fitting)
        self.refine_bounds(order)
        order = _by_bound(order)
        self.beams(order[:self.tuning.beam_configs])
        best_of: dict = {}
        for f in self.found:
            best_of[f.cfg.config] = max(best_of.get(f.cfg.config, 0.0), f.samples_per_s)
        # those with the best plan so far first: under a time limit the best plans are found sooner
        order.sort(key=lambda c: (-best_of.get(c.config, 0.0), -c.ub_sps, c.config.micro_batch,
                                  c.config.shard_group, c.config.root))
        self.say(f"incumbent {self.kth_best():.4g} samples/s, {sum(c.ub_sps > self.goal() for c in order)} "
                 "configurations may beat it" + (f" by more than {self.rel_gap:.2%}" if self.rel_gap else ""))
        self.exact_searches(self.probe_or_graph(order))

    def beams(self, cfgs: list) -> None:
        """A beam run with the relaxed bounds on each of these (a good incumbent early)."""
        for c in cfgs:
            if self.expired() or c.ub_sps <= self.goal():
                continue
            self.run(c, self.goal(), beam=beam_width(c, self.tuning))

    # -- bounds ----------------------------------------------------------------------------------

    def refine_bounds(self, order: list) -> None:
        """The last block decided exactly (Engine.frontier_bound); a configuration none of whose
        plans can beat the incumbent is ruled out here."""
        for c in order:
            if self.expired():
                break
            best_k = self.goal()
            if c.ub_sps > best_k:
                c.ub_sps = min(c.ub_sps, _refined_ub(c, self.pq_max, best_k, self.top_k, self.tuning.refine_depth))

    def bound_by_graph(self, c: _Cfg, best_k: float) -> None:
        """Tighten c.ub_sps with its new key graph: at the start, then after the last block."""
        c.ub_sps = min(c.ub_sps, _config_ub(c, self.pq_max, _thr_q(c, best_k)))
        if c.ub_sps > best_k:
            c.ub_sps = min(c.ub_sps, _refined_ub(c, self.pq_max, best_k, self.top_k, self.tuning.refine_depth))

    # -- the proof -------------------------------------------------------------------------------

    def probe_or_graph(self, order: list) -> list:
        """Per configuration that may still beat the incumbent: a probe of the exact search with
        the relaxed bounds (which may finish it), else its key graph (keygraph.py: exact
        time-to-go), a bound from it and a beam run on it. Returns those left for an exact search;
        when the deadline passes, none (their bounds go to open_bounds)."""
        exact_left = []
        for i, c in enumerate(order):
            best_k = self.goal()
            if c.ub_sps <= best_k:
                continue
            if self.expired():
                self.stop_at(order[i:], best_k)
                break
            r = self.run(c, best_k, top_k=self.top_k, max_nodes=self.tuning.probe_nodes)
            if r.complete:
                self.per_mb[c.config.micro_batch].bound_only = False
                self.searched += 1
                self.say(f"exact with the relaxed bounds, {r.stats.nodes} nodes, {r.seconds:.2f} s", c)
                c.ub_sps = 0.0                                   # done: its plans are in `found`
                continue
            best_k = self.goal()
            built = c.engine.build_graph(self.pq_max, _thr_q(c, best_k), self.deadline, self.graph_caps)
            if built == "built":
                self.bound_by_graph(c, best_k)
                if c.ub_sps > best_k:
                    self.run(c, best_k, beam=beam_width(c, self.tuning))
                self.say_graph(c)
            elif built == "deadline":
                self.stop_at(order[i:], best_k)
                break
            else:
                self.over_caps.add(c.config)
                self.say(f"key graph too large (over {self.graph_caps.max_level_keys} keys on a level or "
                         f"{self.graph_caps.max_stage_sims} stage simulations), relaxed bounds only", c)
            exact_left.append(c)
        if self.open_bounds:                         # stopped: these are not searched either
            self.stop_at(exact_left, self.goal())
            return []
        # those with a graph first: their searches are short and may raise the incumbent
        return sorted(exact_left, key=lambda c: (c.engine.graph is None, -c.ub_sps, c.config.micro_batch,
                                                 c.config.shard_group, c.config.root))

    def exact_searches(self, cfgs: list) -> None:
        """The exact search of each configuration that may still beat the incumbent. One left
        with the merged graph or none first gets the real-key graph once more with
        SearchTuning.retry_caps_factor times the caps, under a time limit within
        SearchTuning.retry_time_fraction of the time left (the relaxed bounds alone may not end
        on communication-bound chains; the merged graph prunes memory less)."""
        for i, c in enumerate(cfgs):
            best_k = self.goal()
            if c.ub_sps <= best_k:
                continue
            if self.expired():
                self.stop_at(cfgs[i:], best_k)
                break
            merged = c.engine.graph is not None and c.engine.graph.view is not None
            if c.config in self.over_caps or merged:
                bigger = self.graph_caps.scaled(self.tuning.retry_caps_factor)
                now = time.perf_counter()
                until = None if self.deadline is None else \
                    now + self.tuning.retry_time_fraction * max(0.0, self.deadline - now)
                self.say(f"key graph again with caps {bigger.max_level_keys} keys per level, "
                         f"{bigger.max_stage_sims} stage simulations"
                         + ("" if until is None else f", within {until - now:.1f} s"), c)
                built = c.engine.build_graph(self.pq_max, _thr_q(c, best_k), until, bigger, merged_ok=not merged)
                if built == "built":
                    self.over_caps.discard(c.config)
                    self.bound_by_graph(c, best_k)
                    self.say_graph(c)
                    if c.ub_sps <= best_k:
                        c.ub_sps = 0.0                           # ruled out by its graph
                        continue
                else:
                    self.say(f"the larger key graph: {'not built in its share of the time' if built == 'deadline' else built}"
                             f"; searched with {'the merged graph' if merged else 'the relaxed bounds'}", c)
            self.per_mb[c.config.micro_batch].bound_only = False
            r = self.run(c, best_k, top_k=self.top_k)
            self.searched += 1
            self.say(f"{r.stats.nodes} nodes, {len(r.finished)} plans, {r.seconds:.2f} s", c)
            if not r.complete:
                if math.isfinite(r.open_bound_q):
                    self.open_bounds.append(c.problem.samples / (r.open_bound_q * TIME_Q))
                self.stop_at(cfgs[i + 1:], self.goal())
                break
            c.ub_sps = 0.0                                       # done: its plans are in `found`

    def stop_at(self, cfgs: list, best_k: float) -> None:
        """The deadline passed: the bounds of these configurations stay open."""
        self.open_bounds.extend(x.ub_sps for x in cfgs if x.ub_sps > best_k)

    def expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    # -- progress and the result -----------------------------------------------------------------

    def say(self, msg: str, c: _Cfg | None = None) -> None:
        where = "" if c is None else f"mb {c.config.micro_batch} sg {c.config.shard_group} root {c.config.root}: "
        _progress(f"search [{time.perf_counter() - self.t0:.1f} s]: {where}{msg}", self.progress)

    def say_graph(self, c: _Cfg) -> None:
        kind = "key graph" if c.engine.graph.view is None else "merged key graph"
        self.say(f"{kind} of {c.engine.graph.size} nodes, bound {c.ub_sps:.4g} samples/s, "
                 f"best {self.kth_best():.4g}", c)

    def result(self, spec: ModelSpec, hw: HardwareProfile, mem_limit_bytes: float, space: SearchSpace,
               lister: _Lister, problems: dict) -> SearchResult:
        cfgs, order = lister.cfgs, lister.fitting
        per_mb = self.per_mb
        for f in self.found:
            st, sps = per_mb[f.cfg.config.micro_batch], f.samples_per_s
            st.best_samples_per_s = sps if st.best_samples_per_s is None else max(st.best_samples_per_s, sps)
        top = []
        for f in self.found[:self.top_k]:
            plan = f.cfg.problem.plan(f.finished.attn, f.finished.mlp, f.finished.ckpt)
            top.append(TopPlan(plan, estimate(spec, hw, plan)))
        best = top[0].prediction.samples_per_s if top else 0.0
        open_bounds = self.open_bounds
        timed_out = bool(open_bounds)
        # what was pruned for the tolerance could beat the k-th best by up to rel_gap (never more
        # than the bound of the whole space)
        tolerated = [min(self.kth_best() * (1.0 + self.rel_gap), self.global_ub)] if self.rel_gap and top else []
        bound = max([best] + open_bounds + tolerated) if top else (max(open_bounds) if open_bounds else 0.0)
        open_cfgs = tuple(OpenConfig(x.config.micro_batch, x.config.shard_group, x.config.root, float(c.ub_sps),
                                     "key graph over the caps" if c.config in self.over_caps
                                     else "not finished within the time limit")
                          for c in order if timed_out and c.ub_sps > self.goal()    # (below: within rel_gap)
                          for x in (c, *c.twins))
        common = dict(
            top=tuple(top), nodes=self.nodes, leaves=self.leaves,
            per_micro_batch=tuple(MicroBatchOutcome(mb, st.best_samples_per_s,
                                                    st.bound_only and st.best_samples_per_s is None)
                                  for mb, st in sorted(per_mb.items())),
            evaluated=tuple(self.evaluated),
            configs=len(cfgs), configs_searched=self.searched, open_configs=open_cfgs,
            model=spec, hardware=hw, mem_limit_bytes=mem_limit_bytes)
        if top:
            status = "time_limit" if timed_out else ("optimal" if bound <= best else "within_gap")
            gap = (bound - best) / best
            e = top[0].prediction
            head = {"optimal": "optimal", "within_gap": f"within the {self.rel_gap:.2%} gap tolerance",
                    "time_limit": "best found"}[status]
            msg = (f"{head}: {best:.4g} samples/s at {e.peak_memory_bytes / 2**30:.2f} GiB peak"
                   + (f", gap {gap:.2%}" if status != "optimal" else ""))
            if open_cfgs:
                msg += "; open: " + _describe_open(open_cfgs)
            if timed_out and lister.unlisted_open:
                msg += "; " + _describe_unlisted(lister.unlisted_open)
            return _result(status, top[0].plan, e, bound, gap, time.perf_counter() - self.t0, msg, **common)
        if timed_out:
            msg = "time limit reached before any plan that fits was found"
            if lister.unlisted_open:
                msg += "; " + _describe_unlisted(lister.unlisted_open)
            return _result("time_limit", None, None, bound, math.inf, time.perf_counter() - self.t0, msg, **common)
        # half of what is left: a caller may want to diagnose relaxed spaces within the same limit
        now = time.perf_counter()
        mp = min_peak(spec, hw, space, cache=problems,
                      deadline=None if self.deadline is None else now + max(0.0, self.deadline - now) / 2,
                      time_limit_s=None)
        msg = (f"no plan fits {mem_limit_bytes / 2**30:.2f} GiB: the least peak memory in this space is "
               f"{'at least ' if not mp.proven else ''}{mp.peak_bytes / 2**30:.2f} GiB")
        return _result("infeasible", None, None, 0.0, math.inf, time.perf_counter() - self.t0, msg,
                       min_peak_memory_bytes=mp.peak_bytes, min_peak_plan=mp.plan, min_peak_proven=mp.proven,
                       **common)


def _result(status: str, plan: Plan | None, prediction: Estimate | None, bound: float, gap: float, seconds: float,
            message: str, *, min_peak_memory_bytes: float = math.nan, min_peak_plan: Plan | None = None,
            min_peak_proven: bool = True, **fields) -> SearchResult:
    assert status in STATUSES, status
    return SearchResult(status=status, plan=plan, prediction=prediction, best_bound_samples_per_s=float(bound),
                        gap=float(gap),
                        seconds=seconds, message=message, min_peak_memory_bytes=float(min_peak_memory_bytes),
                        min_peak_plan=min_peak_plan, min_peak_proven=min_peak_proven, **fields)


def _uniform_finished(pb: Problem, eng: Engine) -> list:
    """Every uniform plan (one choice everywhere, checkpointing on or off everywhere) of a problem."""
    nb = len(pb.blocks)
    fins = []
    for i in range(len(pb.choices)):
        for ck in pb.ckpt_options:
            t_q, peak_q = eng.path_end([i] * nb, [i] * nb, [ck] * nb)
            fins.append(Finished(t_q, peak_q, [i] * nb, [i] * nb, [ck] * nb))
    return fins


def _thr_q(c: _Cfg, sps: float) -> float:
    """The iteration time (fixed point) a plan of c must beat to exceed sps samples/s."""
    return (c.problem.samples / sps / TIME_Q) if sps > 0 else math.inf


def _describe_unlisted(unlisted: list) -> str:
    """The micro-batches never listed that may still beat the best plan found."""
    mbs = sorted(mb for mb, _ub in unlisted)
    top = max(ub for _mb, ub in unlisted)
    where = f"micro-batch {mbs[0]}" if len(mbs) == 1 else f"{len(mbs)} micro-batches in {mbs[0]}-{mbs[-1]}"
    return f"{where} not listed within the time limit may reach {top:.4g} samples/s"


def _describe_open(open_cfgs: tuple[OpenConfig, ...]) -> str:
    """One phrase per (micro-batch, shard group, bound, reason), the root strategies together."""
    groups: dict = {}
    for o in open_cfgs:
        k = (o.micro_batch, o.shard_group, f"{o.bound_samples_per_s:.4g}", o.reason)
        groups.setdefault(k, []).append(o.root)
    parts = [f"micro-batch {mb} (shard group {sg}, root {'/'.join(roots)}) may reach {b} samples/s, {reason}"
             for (mb, sg, b, reason), roots in groups.items()]
    if any(o.reason == "key graph over the caps" for o in open_cfgs):
        hint = "larger --graph-max-keys/--graph-max-sims with --time-limit 0 can prove or rule them out"
    else:
        hint = ("a longer --time-limit searches them further; with 0, to the proof, which may need larger "
                "--graph-max-keys/--graph-max-sims")
    return "; ".join(parts) + f" ({hint})"


def _config_ub(c: _Cfg, pq_max: float, thr_q: float = math.inf) -> float:
    """Upper bound on samples/s of any fitting plan of this configuration faster than thr_q."""
    eng = c.engine
    L, K = eng.start()
    lb, mem_lb = eng.lower_bounds(0, L, K, pq_max, graph=eng.graph_for(pq_max, thr_q), CM=K)  # start: its own merge
    if mem_lb[0] > pq_max or not math.isfinite(lb[0]):
        return 0.0
    return c.problem.samples / (max(lb[0], 1.0) * TIME_Q)


def _refined_ub(c: _Cfg, pq_max: float, best_sps: float, top_k: int, depth: int) -> float:
    """Upper bound on samples/s of any fitting plan of this configuration faster than
    best_sps: the first `depth` decisions expanded exactly (Engine.frontier_bound)."""
    thr_q = (c.problem.samples / best_sps / TIME_Q) if best_sps > 0 else math.inf
    lb_q, _nodes = c.engine.frontier_bound(depth, pq_max=pq_max, thr_q=thr_q, top_k=top_k)
    if not math.isfinite(lb_q):
        return 0.0
    return c.problem.samples / (max(lb_q, 1.0) * TIME_Q)


@dataclass(frozen=True)
class MinPeak:
    """The least estimate() peak memory over a space: exact with a plan that attains it, or, when
    the deadline passed first, a proven lower bound (proven False; plan: the leanest found)."""

    peak_bytes: float
    plan: Plan | None
    proven: bool = True


def earlier_deadline(deadline: float | None, time_limit_s: float | None) -> float | None:
    """The earlier of an absolute deadline (time.perf_counter()) and time_limit_s from now."""
    if time_limit_s is None:
        return deadline
    own = time.perf_counter() + time_limit_s
    return own if deadline is None else min(deadline, own)


def min_peak(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace = SearchSpace(), *,
             cache: dict | None = None, deadline: float | None = None,
             time_limit_s: float | None = DEFAULT_TIME_LIMIT_S) -> MinPeak:
    """The least estimate() peak memory over the space and a plan that attains it. Exact:
    micro-batches are taken in increasing order and the loop stops once every configuration's
    memory lower bound is at least the best peak found (the bound grows with the micro-batch at
    fixed accumulation; with a global batch every valid micro-batch is examined). deadline
    (time.perf_counter()): stop then with the least memory lower bound of what is left;
    time_limit_s (default DEFAULT_TIME_LIMIT_S, None: none) bounds it from the call as well."""
    deadline = earlier_deadline(deadline, time_limit_s)
    cache = {} if cache is None else cache
    devices = devices_of(space, hw)
    groups = shard_groups_of(space, hw, devices)
    variants = checkpoint_variants(space, spec)
    mbs = candidate_micro_batches(space, devices)
    best_q, best = math.inf, None
    expired = (lambda: False) if deadline is None else (lambda: time.perf_counter() > deadline)
    # what no configuration can go below (resident states): for micro-batches never examined
    floor_q = least_resident_bytes(spec, hw, space, cache) / MEM_Q - 64.0 * (len(spec.blocks) + 2)
    below_q = floor_q                    # ... and, without a global batch, the last examined's least bound
    open_q = math.inf                    # least memory lower bound of what the deadline left
    for mb in mbs:
        if expired():
            open_q = below_q
            break
        m = grad_accum_of(space, mb, devices)
        cs = []
        for sg in groups:
            for root, v in ((r, v) for r in space.roots for v in variants):
                cfg = Config(devices, mb, m, sg, space.precision, space.optimizer, root, v.selective)
                pb = build_problem(spec, hw, cfg, v.choices, v.options, cache)
                cs.append(_Cfg(cfg, pb, _mem_lb_q(pb)))
        least = min(c.mem_lb_q for c in cs)
        if space.global_batch is None:
            if least >= best_q:
                break
            below_q = max(floor_q, least)
        for c in sorted(merge_twins(cs), key=lambda c: (c.mem_lb_q, c.config.shard_group, c.config.root)):
            if c.mem_lb_q >= best_q:
                continue
            if c.mem_lb_q > FIXED_POINT_MAX:     # beyond the fixed point of the tables: its bound only
                open_q = min(least, floor_q) if space.global_batch is not None else least
                break
            eng = Engine(c.problem)
            for f in _uniform_finished(c.problem, eng):      # a lean plan at once, should the deadline come
                if f.peak_q < best_q:
                    best_q, best = f.peak_q, (c, f)
            r = eng.run(pq_max=(best_q - 1) if math.isfinite(best_q) else math.inf, beam=TUNING.beam, memory_only=True,
                        deadline=deadline)
            cand = min((f.peak_q for f in r.finished), default=math.inf)
            if r.complete:
                r = eng.run(pq_max=min(best_q, cand) if math.isfinite(min(best_q, cand)) else math.inf,
                            memory_only=True, deadline=deadline)
            for f in r.finished:
                if f.peak_q < best_q:
                    best_q, best = f.peak_q, (c, f)
            if not r.complete:           # this one, the rest of this micro-batch and every later one stay open
                open_q = min(least, floor_q) if space.global_batch is not None else least
                break
        if math.isfinite(open_q):
            break
    plan = None
    if best is not None:
        c, f = best
        plan = c.problem.plan(f.attn, f.mlp, f.ckpt)
    if open_q < best_q:
        return MinPeak(total_peak_bytes(max(open_q, 0.0), hw), plan, proven=False)
    if plan is None:
        return MinPeak(math.inf, None)
    return MinPeak(estimate(spec, hw, plan).peak_memory_bytes, plan)


def pareto_front(spec: ModelSpec, hw: HardwareProfile, space: SearchSpace = SearchSpace(), *,
                 mem_range: tuple[float, float] | None = None, progress: bool = False,
                 deadline: float | None = None,
                 time_limit_s: float | None = DEFAULT_PARETO_TIME_LIMIT_S,
                 front_lines: bool = True) -> ParetoResult:
    """Every (peak memory, samples/s) trade-off of the space at once: the DP of each
    configuration with no memory limit (or mem_range's upper end) keeps, per key, every label
    not dominated in (time, memory), so its complete plans contain the whole front; a label is
    also dropped when a plan already found uses no more memory and is at least as fast. Each
    front point is what search() returns with that point's peak as the limit. deadline
    (time.perf_counter()): stop then; the result is of the configurations done (proven False).
    time_limit_s (default DEFAULT_PARETO_TIME_LIMIT_S, None: none) bounds it from the call as well.
    front_lines False: a label is tested against the front at its memory bound only, not by each
    line of its time bound (front.py); the same front, for bench/pareto_lines.py's A/B."""
    deadline = earlier_deadline(deadline, time_limit_s)
    warm_in_background(FRONT_ENTRY_POINTS)
    t0 = time.perf_counter()
    lo, hi = mem_range if mem_range is not None else (0.0, float(hw.device.usable_memory_bytes))
    pq_max = _limit_q(hi, hw)
    cache: dict = {}
    cfgs = merge_twins([c for c in _configs(spec, hw, space, pq_max, cache, deadline) if c.mem_lb_q <= pq_max])
    proven = deadline is None or time.perf_counter() <= deadline
    pts: list[_FrontCandidate] = []
    evaluated: list = []
    nodes = 0
    # Seeds: every configuration's uniform plans. They are plans of the space, so a label that
    # cannot beat one at no more memory is pruned from the first pass on, as by the plans it finds.
    def collect(c: _Cfg, fins: list[Finished]) -> None:
        for f in fins:
            peak, sps = _finished_value(c.problem, f, hw)
            if len(evaluated) < EVALUATED_CAP:
                evaluated.append((peak, sps))
            if peak >= lo:
                pts.extend(_FrontCandidate(peak, sps, x, f) for x in (c, *c.twins))

    engines = {id(c): Engine(c.problem) for c in cfgs}
    for c in cfgs:
        if deadline is not None and time.perf_counter() > deadline:
            break
        collect(c, [f for f in _uniform_finished(c.problem, engines[id(c)]) if f.peak_q <= pq_max])
    front_peak, front_sps = _front_arrays(pts)
    # larger micro-batches first: their fast plans at high memory prune the smaller ones' labels
    # there (mingpt-48l-1536 without splits: 172 s against 231 s smallest first, 683 points both)
    for c in sorted(cfgs, key=lambda c: (-c.config.micro_batch, c.config.shard_group, c.config.root)):
        eng = engines[id(c)]
        stairs = FrontStairs.of(front_peak, front_sps, c.problem.samples, pq_max, hw.memory.fragmentation,
                                hw.memory.context_bytes)
        if deadline is not None and time.perf_counter() > deadline:
            proven = False
            break
        r = (eng.run(pq_max=pq_max, front=stairs, deadline=deadline) if front_lines else
             eng.run(pq_max=pq_max, thr_fn=stairs.threshold, deadline=deadline))
        nodes += r.stats.nodes
        if not r.complete:
            proven = False
            break
        collect(c, r.finished)
        front_peak, front_sps = _front_arrays(pts)
        _progress(f"pareto: mb {c.config.micro_batch} root {c.config.root}: {r.stats.nodes} nodes", progress)
    pts.sort(key=lambda p: (p.peak_bytes, -p.samples_per_s, p.cfg.config.micro_batch))
    front = []
    best = -1.0
    for p in pts:
        if p.samples_per_s > best:
            f = p.finished
            front.append((p.peak_bytes, p.samples_per_s, p.cfg.problem.plan(f.attn, f.mlp, f.ckpt)))
            best = p.samples_per_s
    return ParetoResult(front, evaluated, time.perf_counter() - t0, nodes, proven)


class _FrontCandidate(NamedTuple):
    """A complete plan of pareto_front's searches, a front point if nothing found dominates it."""

    peak_bytes: float                    # its estimate() peak memory (from the fixed-point label)
    samples_per_s: float
    cfg: _Cfg
    finished: Finished


def _front_arrays(pts: list[_FrontCandidate]):
    """(peaks ascending, best samples/s at a peak up to each): what a new plan must beat."""
    if not pts:
        return np.zeros(0), np.zeros(0)
    arr = sorted((p.peak_bytes, p.samples_per_s) for p in pts)
    peaks = np.array([a[0] for a in arr])
    sps = np.maximum.accumulate(np.array([a[1] for a in arr]))
    return peaks, sps
