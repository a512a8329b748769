"""The key graph over merged keys: for communication-bound configurations, whose real keys are
too many for keygraph.py.

Why merging is sound. A stage's time depends on the queued communication only through its total
work W, and is non-decreasing in W; so is the work it leaves queued (docs/search.md, "The merged
key graph", derives it from run_compute's fluid model). A merged key keeps the pending step and
replaces the queue by one item of W rounded down to `grid_s`: along the same decisions, the merged
path has, stage by stage, no more queued work and no more time than the real one, and the same
resident + kept bytes S (which do not depend on keys). Memory events do depend on the queue, so
the merged transitions keep only S: U grows by S at every stage (fast.apply: U' >= U + S), a lower
bound of the real U. The forward pass and H_lambda, M of keygraph.py then bound every real
completion whose merged image they cover.

Which merged node bounds a label. Rounding is applied after every stage, so the merged image of
a label's path is not a function of its real key: each label carries its own merged id, advanced
with `table` along its decisions (dp.Engine does this when its graph is merged). Every node of
that image path has a forward label no larger than the label's, so pruning a node, and bounding
by kept nodes only, never cuts a real plan that fits and beats the threshold.
"""

import math

import numpy as np

from osdp_sim.arrays import grown
from osdp_sim.costmodel.fast import NEG, TIME_Q
from osdp_sim.planner.keystore import CkMlpDone, DeferredMlp
from osdp_sim.planner.labels import D_Y, G_A, NEW_PM, O_M1, O_M2, O_V, O_Y, P_A, Table, unique_inverse
from osdp_sim.planner.tables import TableArena

# the rounding grid, as a fraction of the mean time per decision of the configuration's bound
GRID_FRACTION = 0.01


class MergedView:
    """The transitions of an Engine between merged keys (interned in the engine's KeyStore)."""

    def __init__(self, engine, grid_s: float):
        self.engine, self.grid_s = engine, grid_s
        self.pb, self.positions = engine.pb, engine.positions
        self.pm_sum = engine.pm_sum       # (its PM column is zeroed: the optimizer temporary is not kept)
        self._merged = np.full(64, -1, dtype=np.int64)     # key id -> its merged key id, -1 not yet
        self.arenas: dict = {}                                # slot class -> TableArena, over merged ids

    @property
    def stage_sims(self) -> int:
        return self.engine.stage_sims

    def start(self):
        return self.engine.start()          # no queue yet: the start key is its own merge

    def lower_bounds(self, g, C, CK, pq_max, graph=None):
        return self.engine.lower_bounds(g, C, CK, pq_max)     # relaxed: monotone in queued work

    def merge(self, kid: int) -> int:
        self._merged = grown(self._merged, kid + 1, -1)
        m = int(self._merged[kid])
        if m < 0:
            store = self.engine.store
            key = store.keys[kid]
            if isinstance(key, CkMlpDone):
                m = store.intern(CkMlpDone(self.merge(key.key_id)))
            elif isinstance(key, DeferredMlp):
                m = store.intern(DeferredMlp(self.merge(key.key_id), key.choice))
            else:
                pend, queue = key
                work = sum(q[0] for q in queue)
                if self.grid_s > 0:                     # 0: the exact total (no rounding)
                    work = math.floor(work / self.grid_s) * self.grid_s
                m = store.intern((pend, ((work, 0.0, 0.0, 0.0, work, True),) if work > 0 else ()))
            self._merged = grown(self._merged, max(kid, m) + 1, -1)
            self._merged[kid] = self._merged[m] = m
        return m

    def merged_ids(self, kids: np.ndarray) -> np.ndarray:
        """merge() of many key ids."""
        if len(kids) == 0:
            return kids
        self._merged = grown(self._merged, int(kids.max()) + 1, -1)
        for k in np.unique(kids[self._merged[kids] < 0]):
            self.merge(int(k))
        return self._merged[kids]

    @property
    def store(self):
        return self.engine.store          # merged ids are interned with the engine's keys

    def tables(self, mids: np.ndarray, g: int, deadline: float | None = None, timeout=None):
        """Engine.tables from merged keys, to merged keys, with deltas that keep the time and S and
        no memory event (the codes are the engine's, in the same order)."""
        return self.table_rows(mids, g, deadline, timeout)[0].gather(mids)

    def table_rows(self, mids: np.ndarray, g: int, deadline: float | None = None, timeout=None):
        """Engine.table_rows over merged keys (tables)."""
        a = self.arenas.get(self.engine.slot_class(g))
        if a is None:
            a = self.arenas[self.engine.slot_class(g)] = TableArena(self.engine.arena(g).codes)
        new = a.missing(mids)
        if len(new):
            ds, nks, _codes = self.engine.tables(new, g, deadline, timeout)   # a copy (TableArena.gather)
            ds[:, :, [O_V, O_Y, O_M1, O_M2]] = NEG     # forward, backward and checkpoint events
            ds[:, :, [D_Y, NEW_PM, G_A, P_A]] = 0      # live bytes, optimizer temporary, re-gathers
            a.add_rows(new, self.merged_ids(nks.reshape(-1)).reshape(nks.shape), ds)
        return a, a.row_of[mids]

    def table(self, mid: int, g: int) -> Table:
        self.tables(np.array([mid], dtype=np.int64), g)
        return self.arenas[self.engine.slot_class(g)].table(mid)

    def advance(self, g: int, M: np.ndarray, col: np.ndarray) -> np.ndarray:
        """Merged ids after decision g of labels with merged ids M taking the col-th code."""
        if len(M) == 0:
            return np.zeros(0, dtype=np.int64)
        um, inv = unique_inverse(M)
        return self.tables(um, g)[1][inv, col]


def grid_for(engine, pq_max: float) -> float:
    """GRID_FRACTION of the mean time per decision of the configuration's relaxed bound."""
    L, K = engine.start()
    lb, _m = engine.lower_bounds(0, L, K, pq_max)
    t = float(lb[0]) * TIME_Q / max(1, engine.pb.m) if np.isfinite(lb[0]) else 1.0
    return max(t / len(engine.positions) * GRID_FRACTION, 1e-9)
