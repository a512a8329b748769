"""Pending steps and stage parts (fast.StagePart) as rows of arrays, the way fold.run_stages
reads them: a stage is a pending step's head task joined with a part, so a search keeps each
pending step once and each part once, and the stages of many keys are one compiled call of
(key, pending step, part) jobs."""

import numpy as np

from osdp_sim.arrays import grown
from osdp_sim.costmodel.fold import (ICOLS, PART_F_COLS, PART_FIXED, PART_I_COLS, PD_FORWARD_GATHER, PD_GATHERED,
                                     PD_ITEM_BEGIN, PD_ITEM_END, PEND_F_COLS, PEND_I_COLS, PT_BARRIER, PT_DT,
                                     PT_DT_EXTRA, PT_EXTRA_BEGIN, PT_EXTRA_END, PT_EXTRA_FIRST, PT_LAST_EVENT,
                                     PT_LAST_FWD, PT_NEW_PEND, PT_O_V, PT_O_V_FLOOR, PT_SLOWDOWN, PT_SPLIT,
                                     PT_TAIL_ITEM_BEGIN, PT_TAIL_ITEM_END, PT_TAIL_TASK_BEGIN, PT_TAIL_TASK_END,
                                     PT_Y0, QCOLS, run_stages, task_row)


class StageArena:
    """The tasks and items of every tail (stored once however many parts share it), the rows of
    every pending step (numbered by value: pend_number) and of every part (part_number)."""

    def __init__(self):
        self.tasks_f = np.zeros((256, 5))
        self.tasks_i = np.zeros((256, 3), dtype=np.int64)
        self.items = np.zeros((256, ICOLS))
        self.pend_f = np.zeros((16, PEND_F_COLS))
        self.pend_i = np.zeros((16, PEND_I_COLS), dtype=np.int64)
        self.part_f = np.zeros((64, PART_F_COLS))
        self.part_i = np.zeros((64, PART_I_COLS), dtype=np.int64)
        self.part_fixed = np.zeros((64, len(PART_FIXED)), dtype=np.int64)
        self.pends: list = []                          # number -> fast.Pending (or None)
        self._pend_nos: dict = {}                      # Pending (by value) or None -> its number
        self._parts: dict = {}                         # (id of a StagePart, pm_sum) -> (the part, its number)
        self._tails: dict = {}                         # id of a tail -> (the tail, its task and item ranges)
        self.n_parts = self.n_tasks = self.n_items = 0

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

    def _append_items(self, items: tuple) -> tuple[int, int]:
        _t0, _t1, i0, i1 = self._append(np.zeros((0, 5)), np.zeros((0, 3), dtype=np.int64),
                                        np.array(items, dtype=np.float64).reshape(-1, ICOLS))
        return i0, i1

    def pend_number(self, pend) -> int:
        """The number of a pending step (fast.Pending, or None: the key after the last stage),
        the same for equal ones."""
        n = self._pend_nos.get(pend)
        if n is None:
            n = self._pend_nos[pend] = len(self.pends)
            self.pends.append(pend)
            if n == len(self.pend_f):
                self.pend_f, self.pend_i = grown(self.pend_f, n + 1, 0.0), grown(self.pend_i, n + 1, 0)
            if pend is not None:
                row, _bar = task_row(pend.bwd_s, pend.start_deltas, pend.end_delta, None)
                self.pend_f[n, :len(row)] = row
                self.pend_f[n, PD_FORWARD_GATHER] = pend.forward_gather_s or 0.0
                self.pend_f[n, PD_GATHERED] = pend.gathered_bytes
                self.pend_i[n, PD_ITEM_BEGIN], self.pend_i[n, PD_ITEM_END] = self._append_items(pend.end_items)
        return n

    def part_number(self, part, pm_sum: bool) -> int:
        """The number of a part (fast.StagePart) with the optimizer temporaries summed (pm_sum,
        lowering.optimizer_temp_sums) or their largest taken."""
        hit = self._parts.get((id(part), pm_sum))
        if hit is not None:
            return hit[1]
        p = self.n_parts
        if p == len(self.part_f):
            self.part_f, self.part_i = grown(self.part_f, p + 1, 0.0), grown(self.part_i, p + 1, 0)
            self.part_fixed = grown(self.part_fixed, p + 1, 0)
        tail = self._tails.get(id(part.tail))
        if tail is None:
            tail = self._tails[id(part.tail)] = (part.tail, self._append(*part.tail))
        f, i = self.part_f[p], self.part_i[p]
        f[PT_SLOWDOWN], f[PT_DT], f[PT_LAST_FWD], f[PT_DT_EXTRA] = part.slowdown, part.dt_s, part.last_fwd_s, \
            part.dt_extra_s
        f[PT_O_V], f[PT_LAST_EVENT], f[PT_O_V_FLOOR], f[PT_Y0] = part.o_v_bytes, part.last_event_bytes, \
            part.o_v_floor_bytes, part.y0_bytes
        i[PT_TAIL_TASK_BEGIN:PT_TAIL_ITEM_END + 1] = tail[1]
        i[PT_EXTRA_BEGIN], i[PT_EXTRA_END] = self._append_items(part.first_extra)
        i[PT_EXTRA_FIRST], i[PT_BARRIER], i[PT_SPLIT] = part.extra_first, part.first_barrier, part.split
        i[PT_NEW_PEND] = self.pend_number(part.new_pend)
        fixed = part._replace(pm=part.pm if pm_sum else part.pm_max)
        self.part_fixed[p] = [getattr(fixed, name) for name in PART_FIXED]
        self._parts[(id(part), pm_sum)] = (part, p)
        self.n_parts = p + 1
        return p

    def new_pend(self, parts):
        """The pending step number each of these parts (an array, or one number) leaves."""
        return self.part_i[parts, PT_NEW_PEND]

    def run(self, queues: np.ndarray, queue_begin: np.ndarray, queue_end: np.ndarray, job_key: np.ndarray,
            job_pend: np.ndarray, job_part: np.ndarray):
        """fold.run_stages on these jobs with the arena's rows."""
        return run_stages(queues, queue_begin, queue_end, job_key, job_pend, job_part, self.tasks_f, self.tasks_i,
                          self.items, self.pend_f, self.pend_i, self.part_f, self.part_i, self.part_fixed)

    def run_one(self, queue: np.ndarray, pend_no: int, part_no: int) -> tuple[list, np.ndarray]:
        """One stage: (its deltas, fold.STAGE_DELTAS's columns, as ints; the queue left)."""
        one = np.zeros(1, dtype=np.int64)
        queue = np.ascontiguousarray(queue, dtype=np.float64).reshape(-1, QCOLS)
        D, left, begin, end = self.run(queue, one, np.array([len(queue)], dtype=np.int64), one,
                                       np.array([pend_no], dtype=np.int64), np.array([part_no], dtype=np.int64))
        return D[0].tolist(), left[begin[0]:end[0]]
