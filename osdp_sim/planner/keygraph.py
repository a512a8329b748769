"""Exact time-to-go over the key graph of one problem: a lower bound with no overlap relaxation.

A label's future depends only on its key (dp.py), and a stage's time and its resident + kept
bytes S are functions of (key, decision) alone: the label adds m * dt + opt to t and S to every
event already counted (fast.apply: U' >= U + S). So the decisions form a layered graph whose
nodes are (decision, key) and whose edges carry (time, S), and for a label (t, U) with key k
at slot g (waiting for decision g) and any lambda >= 0, every completion that fits the limit pq has
sum S <= pq - U, hence

    T_rest >= min over paths from (g, k) of sum(time + lambda S) - lambda (pq - U)
            = H_lambda(g, k) - lambda (pq - U),

and the final peak >= U + M(g, k), M the least sum of S over paths. H_lambda and M are computed
exactly by one backward pass over the graph (a shortest path on a DAG), so the time part of the
bound carries every interaction of the two-stream schedule across blocks (the queue a partly
sharded choice leaves behind, the gathers waiting behind it): what bounds.py prices by
relaxation is priced here at its simulated cost.

Which nodes. A forward pass from the start label keeps, per node, the componentwise least label
over the edges into it (every stage update is monotone, so it is <= every real label there) and
drops a node when that least label cannot fit pq or beat thr_q under the bounds of bounds.py: no
real label there can, so a plan that fits and beats thr_q never passes through it. H and M are
minima over paths through kept nodes only, which bounds every completion that matters; labels at
a dropped node get an infinite bound. The graph is therefore valid for any run whose limit and
threshold are no larger than the ones it was built with (`covers`). When reductions pile up
(communication-bound chains) the keys multiply; past `max_level_keys` nodes on one level the graph is
abandoned (or past `max_stage_sims` new stage simulations in all) and the search keeps the
relaxed bounds alone (GraphCaps: the defaults keep a graph under about 20 s on a 48-block model).
"""

import time
from dataclasses import dataclass

import numpy as np

from osdp_sim.arrays import grown
from osdp_sim.planner.labels import T, peaks
from osdp_sim.planner.merged import MergedView

N_LAMBDA = 32
LAMBDA_WIDEN = 2.0       # the grid spans the breakpoints' range widened this much each way


@dataclass(frozen=True)
class GraphCaps:
    """How large a key graph may grow before it is abandoned."""

    max_level_keys: int = 3000         # nodes on one level
    max_stage_sims: int = 300_000      # new stage simulations (about 7 us each with the compiled fold)

    def scaled(self, f: int) -> "GraphCaps":
        return GraphCaps(self.max_level_keys * f, self.max_stage_sims * f)

    def __le__(self, other: "GraphCaps") -> bool:
        return self.max_level_keys <= other.max_level_keys and self.max_stage_sims <= other.max_stage_sims


class Timeout(Exception):
    """The deadline passed while the graph was being built."""


class TooLarge(Exception):
    """A level of the graph has more nodes, or building it ran more stage simulations, than its
    GraphCaps allow."""


def lambda_grid(j_lam: np.ndarray) -> np.ndarray:
    """0 and a geometric grid of N_LAMBDA points spanning the breakpoints of the separable bound
    (bounds.py, j_lam), widened LAMBDA_WIDEN x each way: every lambda >= 0 gives a valid bound;
    these are where the largest ones lie. The bound is a maximum over the grid, so its spacing
    is what it loses against the best lambda (docs/benchmarks.md, 2026-12-06: 32 points widened
    2x rule out mingpt-48l-1536's micro-batches 5 and 6, which 24 widened 4x left open, and cut
    mingpt-48l-2048's nodes 127 M -> 45 M)."""
    pos = j_lam[j_lam > 0]
    if len(pos) == 0:
        return np.zeros(1)
    return np.concatenate([[0.0], np.geomspace(pos.min() / LAMBDA_WIDEN, pos.max() * LAMBDA_WIDEN, N_LAMBDA)])


def _work(a: np.ndarray, store) -> np.ndarray:
    """a, -1 everywhere, with a place for every key id the store holds (labelfold's work array)."""
    return grown(a, len(store.keys), -1)


class KeyGraph:
    """H_lambda and M per level (rows: the kept keys of that level, sorted by key id)."""

    def __init__(self, engine, lams: np.ndarray, pq_max: float, thr_q: float,
                 deadline: float | None = None, caps: GraphCaps = GraphCaps()):
        self.lams, self.pq_max, self.thr_q = lams, pq_max, thr_q
        self.view = engine if isinstance(engine, MergedView) else None   # over merged keys (merged.py)
        pb = engine.pb
        n = len(engine.positions)
        L, K = engine.start()
        sims_before = engine.stage_sims
        from osdp_sim.planner.labelfold import graph_back, graph_forward
        work = np.full(64, -1, dtype=np.int64)        # key id -> a row, -1 everywhere between calls
        levels = [K]
        for g in range(n):
            if len(K) == 0:                    # nothing left: no plan fits and beats thr_q
                levels.append(K)
                continue
            arena, trow = engine.table_rows(K, g, deadline, Timeout)
            work = _work(work, engine.store)
            L, K = graph_forward(np.ascontiguousarray(L, dtype=np.int64), trow, arena.deltas, arena.new_keys,
                                 int(pb.m), bool(engine.pm_sum), work)
            if g + 1 < n:
                lb, mem_lb = engine.lower_bounds(g + 1, L, K, pq_max)
                ok = (mem_lb <= pq_max) & (lb < thr_q)
            else:
                ok = (peaks(L) <= pq_max) & (L[:, T] < thr_q)
            L, K = L[ok], K[ok]
            if len(K) > caps.max_level_keys or engine.stage_sims - sims_before > caps.max_stage_sims:
                raise TooLarge
            levels.append(K)
        self.levels = levels                 # per level: the kept key ids, sorted
        inf_row = np.full((1, len(lams)), np.inf)
        self.H: list = [None] * (n + 1)
        self.M: list = [None] * (n + 1)
        self.H[n] = np.vstack([np.zeros((len(levels[n]), len(lams))), inf_row])
        self.M[n] = np.r_[np.zeros(len(levels[n])), np.inf]
        lams = np.asarray(lams, dtype=np.float64)
        for g in range(n - 1, -1, -1):
            if deadline is not None and time.perf_counter() > deadline:
                raise Timeout
            if len(levels[g]) == 0:
                self.H[g], self.M[g] = inf_row.copy(), np.array([np.inf])
                continue
            arena, trow = engine.table_rows(levels[g], g)       # built in the forward pass
            nxt = levels[g + 1]
            work[nxt] = np.arange(len(nxt))
            self.H[g], self.M[g] = graph_back(trow, arena.deltas, arena.new_keys, int(pb.m), lams,
                                              self.H[g + 1], self.M[g + 1], work)
            work[nxt] = -1

    def rows_of(self, g: int, K: np.ndarray) -> np.ndarray:
        """Rows of keys K at level g; len(level) (the inf row) for keys not kept there."""
        ks = self.levels[g]
        i = np.searchsorted(ks, K)
        hit = i < len(ks)
        hit[hit] = ks[i[hit]] == K[hit]
        return np.where(hit, i, len(ks))

    @property
    def size(self) -> int:
        return int(sum(len(x) for x in self.levels))

    def covers(self, pq_max: float, thr_q: float) -> bool:
        """Valid for a run with this limit and threshold (both no larger than the graph's)."""
        return pq_max <= self.pq_max and thr_q <= self.thr_q
