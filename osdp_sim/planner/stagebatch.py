"""A decision's new table rows in one compiled call (costmodel/fold.run_stages).

A row is the table of one key at one slot class: one stage per code. What the stages of a row
compute besides the key's queue depends only on the key's pending step and kind (a RowRecipe:
the stage plan of each code, as indices into the store's PlanArena), so the rows of many keys
are one list of (queue, plan) jobs, folded in compiled code; their new keys are interned by the
bytes of the queues left (KeyStore.intern_new_keys)."""

from dataclasses import dataclass, field

import numpy as np

from osdp_sim.costmodel.fast import stage_plan, stage_rows
from osdp_sim.planner.labels import NDELTA, ZERO
from osdp_sim.planner.tables import grown

WRAP_PLAIN, WRAP_CKMLP_DONE, WRAP_DEFERRED = 0, 1, 2
NO_STAGE, NOT_BUILT = -1, -2


@dataclass
class RowRecipe:
    """How the row of a key is made at one slot class, per code (in the class's order). Its plans
    are built when first asked for (plan_ids): a single stage (dp.Engine._stage) needs one."""

    pend: object          # the pending step (fast.Pending) the stages start from
    stages: list          # per code: (steps, stage kind, checkpoint bytes), or None: no stage
    wrap: np.ndarray      # (codes,) WRAP_PLAIN: the stage's new key; WRAP_CKMLP_DONE: CkMlpDone of it;
    #                       WRAP_DEFERRED: DeferredMlp(the row's key, choice), no stage (ZERO deltas)
    choice: np.ndarray    # (codes,) the MLP choice a WRAP_DEFERRED code records
    slowdown: float       # the overlap slowdown (Problem.s)
    pm_sum: bool          # how the optimizer temporaries add up (lowering.optimizer_temp_sums)
    plan: np.ndarray = field(init=False)   # (codes,) PlanArena index, NO_STAGE, or NOT_BUILT
    stage_plans: list = field(init=False)  # (codes,) the fast.StagePlan of each plan built

    def __post_init__(self):
        self.plan = np.array([NO_STAGE if st is None else NOT_BUILT for st in self.stages], dtype=np.int64)
        self.stage_plans = [None] * len(self.stages)

    def plan_ids(self, store, cols: np.ndarray) -> np.ndarray:
        """The plans of codes cols (indices into the class's codes), built where missing."""
        for e in cols[self.plan[cols] == NOT_BUILT].tolist():
            steps, kind, ck = self.stages[e]
            sp = self.stage_plans[e] = stage_plan(self.pend, steps, kind, self.slowdown, ck, self.pm_sum)
            self.plan[e] = store.plans.add(sp, store.pend_number(sp.new_pend))
        return self.plan[cols]


class PlanArena:
    """Stage plans (fast.StagePlan) concatenated as fold.run_stages reads them: each plan's head
    task, and each tail once however many plans share it."""

    def __init__(self):
        from osdp_sim.costmodel.fold import ICOLS, PI_COLS, PLAN_FIXED
        self.tasks_f = np.zeros((256, 5))
        self.tasks_i = np.zeros((256, 3), dtype=np.int64)
        self.items = np.zeros((256, ICOLS))
        self.plan_f = np.zeros((64, 3))
        self.plan_i = np.zeros((64, PI_COLS), dtype=np.int64)
        self.plan_fixed = np.zeros((64, len(PLAN_FIXED)), dtype=np.int64)
        self.new_pend = np.zeros(64, dtype=np.int64)       # KeyStore.pend_number of the plan's new pending step
        self._fixed_names = PLAN_FIXED
        self._tails: dict = {}                             # id of a tail -> (the tail, its four plan_i columns)
        self.n = self.n_tasks = self.n_items = 0

    def _append(self, tasks_f, tasks_i, items) -> tuple[int, int, int, int]:
        """Tasks and their items at the arenas' ends: (task begin, end, item begin, end)."""
        t0, i0 = self.n_tasks, self.n_items
        t1, i1 = t0 + len(tasks_f), i0 + len(items)
        if t1 > len(self.tasks_f):
            self.tasks_f, self.tasks_i = grown(self.tasks_f, t1, 0.0), grown(self.tasks_i, t1, 0)
        if i1 > len(self.items):
            self.items = grown(self.items, i1, 0.0)
        self.tasks_f[t0:t1] = tasks_f
        self.tasks_i[t0:t1] = tasks_i
        if i1 > i0:
            self.items[i0:i1] = items
        self.n_tasks, self.n_items = t1, i1
        return t0, t1, i0, i1

    def add(self, sp, new_pend_no: int) -> int:
        """The index of a new plan."""
        from osdp_sim.costmodel import fold
        p = self.n
        if p == len(self.plan_f):
            self.plan_f, self.plan_i = grown(self.plan_f, p + 1, 0.0), grown(self.plan_i, p + 1, 0)
            self.plan_fixed, self.new_pend = grown(self.plan_fixed, p + 1, 0), grown(self.new_pend, p + 1, 0)
        tail = self._tails.get(id(sp.tail))
        if tail is None:
            tail = self._tails[id(sp.tail)] = (sp.tail, self._append(*sp.tail))
        f, i = self.plan_f[p], self.plan_i[p]
        i[fold.PI_HEAD_TASK_BEGIN:fold.PI_HEAD_ITEM_END + 1] = self._append(
            (sp.head_row,), ((0, len(sp.head_items), sp.head_barrier),), sp.head_items)
        i[fold.PI_TAIL_TASK_BEGIN:fold.PI_TAIL_ITEM_END + 1] = tail[1]
        i[fold.PI_SPLIT] = sp.split
        f[fold.PF_SLOWDOWN], f[fold.PF_DT0], f[fold.PF_Y0] = sp.slowdown, sp.dt0_s, sp.y0_bytes
        self.plan_fixed[p] = [getattr(sp, name) for name in self._fixed_names]
        self.new_pend[p] = new_pend_no
        self.n = p + 1
        return p


def run_rows(store, keys: np.ndarray, inner: list[int], recipes: list[RowRecipe], cols: np.ndarray):
    """The entries cols (indices into the class's codes) of the rows of key ids `keys`, whose stages
    run on the queues of the plain keys `inner`, made by `recipes` (one each, all of one class):
    (new key ids (keys, cols), deltas (keys, cols, NDELTA), stage simulations run)."""
    from osdp_sim.costmodel.fold import QCOLS, run_stages
    queues = [store.queue_rows(i) for i in inner]
    lens = np.array([len(q) for q in queues], dtype=np.int64)
    ends = np.cumsum(lens)
    Q = np.concatenate(queues) if ends[-1] else np.zeros((0, QCOLS))
    P = np.stack([r.plan_ids(store, cols) for r in recipes])
    kk, ee = np.nonzero(P >= 0)
    kk = np.ascontiguousarray(kk)          # nonzero's may be strided: one compiled signature, not two
    job_plan = P[kk, ee]
    pl = store.plans
    D, left, lb, le = run_stages(Q, ends - lens, ends, kk, job_plan, pl.tasks_f, pl.tasks_i, pl.items, pl.plan_f,
                                 pl.plan_i, pl.plan_fixed)
    deltas = np.empty(P.shape + (NDELTA,), dtype=np.int64)
    deltas[:] = ZERO
    deltas[kk, ee] = D
    new_keys = store.intern_new_keys(keys, np.stack([r.wrap[cols] for r in recipes]),
                                     np.stack([r.choice[cols] for r in recipes]), pl.new_pend[job_plan], left, lb, le)
    return new_keys, deltas, len(kk)


def run_one(store, key_id: int, inner: int, recipe: RowRecipe, e: int) -> tuple[int, tuple]:
    """Entry e of key_id's row alone (run_rows's for one stage, with fast.stage_rows): its new key
    id and deltas."""
    wrap = int(recipe.wrap[e])
    if wrap == WRAP_DEFERRED:
        return store.intern_deferred(key_id, int(recipe.choice[e])), ZERO
    p = int(recipe.plan[e])
    if p == NOT_BUILT:
        p = int(recipe.plan_ids(store, np.array([e]))[0])
    left, deltas = stage_rows(recipe.stage_plans[e], store.queue_rows(inner))
    nk = store.intern_rows(int(store.plans.new_pend[p]), left)
    return (store.intern_done(nk) if wrap == WRAP_CKMLP_DONE else nk), deltas
