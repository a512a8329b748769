"""A decision's new table rows in one compiled call (costmodel/fold.run_stages).

A row is the table of one key at one slot class: one stage per code. A stage is the key's
pending step's backward task joined with a part (fast.StagePart) that depends only on the code
and on the key's pending step and kind (a RowRecipe: the part of each code, as numbers in the
store's StageArena), so the rows of many keys are one list of (queue, pending step, part) jobs,
folded in compiled code; their new keys are interned by the bytes of the queues left
(KeyStore.intern_new_keys)."""

from dataclasses import dataclass, field

import numpy as np

from osdp_sim.costmodel.fast import stage_part
from osdp_sim.planner.labels import NDELTA, ZERO

WRAP_PLAIN, WRAP_CKMLP_DONE, WRAP_DEFERRED = 0, 1, 2
NO_STAGE, NOT_BUILT = -1, -2


@dataclass
class RowRecipe:
    """How the row of a key is made at one slot class, per code (in the class's order). Its parts
    are made when first asked for (part_ids): a single stage (dp.Engine._stage) needs one."""

    pend_no: int          # the pending step the stages start from (KeyStore.pend_number)
    stages: list          # per code: (steps, stage kind, checkpoint bytes), or None: no stage
    wrap: np.ndarray      # (codes,) WRAP_PLAIN: the stage's new key; WRAP_CKMLP_DONE: CkMlpDone of it;
    #                       WRAP_DEFERRED: DeferredMlp(the row's key, choice), no stage (ZERO deltas)
    choice: np.ndarray    # (codes,) the MLP choice a WRAP_DEFERRED code records
    slowdown: float       # the overlap slowdown (Problem.s)
    pm_sum: bool          # how the optimizer temporaries add up (lowering.optimizer_temp_sums)
    part: np.ndarray = field(init=False)   # (codes,) StageArena part number, NO_STAGE, or NOT_BUILT

    def __post_init__(self):
        self.part = np.array([NO_STAGE if st is None else NOT_BUILT for st in self.stages], dtype=np.int64)

    def part_ids(self, arena, cols: np.ndarray) -> np.ndarray:
        """The part numbers of codes cols (indices into the class's codes), made where missing."""
        for e in cols[self.part[cols] == NOT_BUILT].tolist():
            steps, kind, ck = self.stages[e]
            self.part[e] = arena.part_number(stage_part(steps, kind, self.slowdown, ck), self.pm_sum)
        return self.part[cols]


def run_rows(store, keys: np.ndarray, inner: list[int], recipes: list[RowRecipe], cols: np.ndarray):
    """The entries cols (indices into the class's codes) of the rows of key ids `keys`, whose stages
    run on the queues of the plain keys `inner`, made by `recipes` (one each, all of one class):
    (new key ids (keys, cols), deltas (keys, cols, NDELTA), stage simulations run)."""
    from osdp_sim.costmodel.fold import QCOLS
    arena = store.stages
    queues = [store.queue_rows(i) for i in inner]
    lens = np.array([len(q) for q in queues], dtype=np.int64)
    ends = np.cumsum(lens)
    Q = np.concatenate(queues) if ends[-1] else np.zeros((0, QCOLS))
    P = np.stack([r.part_ids(arena, cols) for r in recipes])
    kk, ee = np.nonzero(P >= 0)
    kk = np.ascontiguousarray(kk)          # nonzero's may be strided: one compiled signature, not two
    job_part = P[kk, ee]
    job_pend = np.array([r.pend_no for r in recipes], dtype=np.int64)[kk]
    D, left, lb, le = arena.run(Q, ends - lens, ends, kk, job_pend, job_part)
    deltas = np.empty(P.shape + (NDELTA,), dtype=np.int64)
    deltas[:] = ZERO
    deltas[kk, ee] = D
    new_keys = store.intern_new_keys(keys, np.stack([r.wrap[cols] for r in recipes]),
                                     np.stack([r.choice[cols] for r in recipes]), arena.new_pend(job_part),
                                     left, lb, le)
    return new_keys, deltas, len(kk)


def run_one(store, key_id: int, inner: int, recipe: RowRecipe, e: int) -> tuple[int, tuple]:
    """Entry e of key_id's row alone (run_rows's for one stage): its new key id and deltas."""
    wrap = int(recipe.wrap[e])
    if wrap == WRAP_DEFERRED:
        return store.intern_deferred(key_id, int(recipe.choice[e])), ZERO
    arena = store.stages
    p = int(recipe.part_ids(arena, np.array([e]))[0])
    deltas, left = arena.run_one(store.queue_rows(inner), recipe.pend_no, p)
    nk = store.intern_rows(int(arena.new_pend(p)), left)
    return (store.intern_done(nk) if wrap == WRAP_CKMLP_DONE else nk), tuple(deltas)
