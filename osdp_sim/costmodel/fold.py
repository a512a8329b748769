"""The compiled backward fold of costmodel/fast.py: a stage's compute tasks run one after another
against the communication queue, compiled with numba (osdp_sim/jit.py: when it compiles and
where the code is cached).

Layouts (float64 rows, so a stage crosses into compiled code once):
  queue  (n, 6): remaining, alloc_at_start, free_at_end, alloc_at_end, work, started (0/1)
  items  (m, 5): work, alloc_at_start, free_at_end, alloc_at_end, ready_at_end (0/1)
  tasks_f (t, 5): compute work, delta at its end, up to three deltas at its start (0: none)
  tasks_i (t, 3): its new items items[begin:end], the barrier (index into them, -1: none)
A stage's tasks come in two parts, each with its own items: the head (the pending step's task,
which depends on the key's pending step) and the tail (the stage's own steps' tasks, shared by
every pending step); run_stages joins them per job (_join), so nothing is laid out per (pending
step, steps) pair.
"""

import numpy as np

from osdp_sim.costmodel.fast import MEM_Q, NEG, TIME_Q, seg
from osdp_sim.jit import compiled

QCOLS = 6
ICOLS = 5
_NO_QUEUE = np.empty((0, QCOLS))


def queue_array(queue: tuple) -> np.ndarray:
    return np.array(queue, dtype=np.float64) if queue else _NO_QUEUE


def queue_tuple(rows: np.ndarray) -> tuple:
    """A key's queue (fast.py): started is 0.0/1.0 where the tuples had False/True, which compare
    and hash the same."""
    return tuple(map(tuple, rows.tolist()))


def task_row(c: float, start: tuple, end: float, barrier: int | None) -> tuple[tuple, int]:
    """A compute task's tasks_f row and barrier (-1: none)."""
    if len(start) > 3 or (barrier is not None and barrier < 0):
        raise ValueError("a compute task has at most three start deltas and a barrier >= 0")
    return (c, end, *start, *_PAD[len(start)]), -1 if barrier is None else barrier


def pack(tasks: list) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Compute tasks (c, start_deltas, end_delta, new_items, barrier) as run_tasks's arrays."""
    rows_f, rows_i, items = [], [], []
    for c, start, end, new, barrier in tasks:
        row, bar = task_row(c, start, end, barrier)
        rows_f.append(row)
        rows_i.append((len(items), len(items) + len(new), bar))
        items.extend(new)
    return (np.array(rows_f, dtype=np.float64).reshape(-1, 5), np.array(rows_i, dtype=np.int64).reshape(-1, 3),
            np.array(items, dtype=np.float64) if items else _NO_ITEMS)


def head_arrays(row: tuple, barrier: int, items: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One task given as its task_row and items, as run_tasks's arrays."""
    return (np.array([row], dtype=np.float64), np.array([(0, len(items), barrier)], dtype=np.int64),
            np.array(items, dtype=np.float64) if items else _NO_ITEMS)


_PAD = ((0.0, 0.0, 0.0), (0.0, 0.0), (0.0,), ())
_NO_ITEMS = np.empty((0, ICOLS))
NO_TASKS = pack([])


@compiled(inline=True)
def _push(ev_t, ev_o, ev_k, ev_d, ne, t, o, kind, d):
    """Append the event (time, after, kind, delta) at row ne; returns the next free row."""
    ev_t[ne] = t
    ev_o[ne] = o
    ev_k[ne] = kind
    ev_d[ne] = d
    return ne + 1


@compiled(inline=True)
def _item(queue, items, ib, nq, k):
    """Item k of queue[:nq] + items[ib:]: (remaining, alloc_at_start, free_at_end, alloc_at_end,
    work, started, ready_at_end); a new item has its whole work left and has not started."""
    if k < nq:
        return queue[k, 0], queue[k, 1], queue[k, 2], queue[k, 3], queue[k, 4], queue[k, 5] != 0.0, False
    r = ib + k - nq
    return items[r, 0], items[r, 1], items[r, 2], items[r, 3], items[r, 0], False, items[r, 4] != 0.0


@compiled
def _compute_task(c, tf, items, ib, ie, bar_rel, queue, nq, s, out, ev_t, ev_o, ev_k, ev_d):
    """One compute task of work c from time 0 (fast.run_compute's rules). The queue and its new
    items are read as one sequence A = queue[:nq] + items[ib:ie]; the queue left is written to
    `out`. Returns (duration, max live-byte offset, net offset, rows written to out)."""
    n = nq + (ie - ib)
    bar = -1 if bar_rel < 0 else nq + bar_rel
    ne = 0
    for j in range(2, 5):                     # the start deltas, in their order
        d = tf[j]
        if d != 0.0:
            ne = _push(ev_t, ev_o, ev_k, ev_d, ne, 0.0, 0, 1 if d > 0 else 0, d)
    end_delta = tf[1]
    now = 0.0
    crem = c
    k = 0
    active = False
    rem = 0.0
    work = 0.0
    fe = 0.0
    ae = 0.0
    a0 = 0.0
    started = False
    rate = 1.0 / s
    while True:
        while not active and k < n:
            rem_k, a0_k, fe_k, ae_k, work_k, started_k, ready = _item(queue, items, ib, nq, k)
            if ready:                         # becomes ready when the compute task ends
                break
            rem, a0, fe, ae, work, started = rem_k, a0_k, fe_k, ae_k, work_k, started_k
            if not started:
                if a0 != 0.0:
                    ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 0, 1, a0)
                if work <= 0:
                    if fe != 0.0:
                        ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 1, 0, -fe)
                    if ae != 0.0:
                        ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 1, 1, ae)
                    k += 1
                    continue
            active = True
        if not active:
            now += crem
            crem = 0.0
        else:
            step = (crem if crem <= rem else rem) / rate
            now += step
            crem -= step * rate
            rem -= step * rate
        cdone = crem <= 1e-15 * (c if c > 1.0 else 1.0)
        if cdone and end_delta != 0.0:
            ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 0, 1 if end_delta > 0 else 0, end_delta)
        if active and rem <= 1e-15 * (work if work > 1.0 else 1.0):
            if fe != 0.0:
                ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 0, 0, -fe)
            if ae != 0.0:
                ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 0, 1, ae)
            active = False
            k += 1
        if cdone:
            break
    if bar >= k:                              # the next task waits: items up to the barrier run alone
        z = bar
        while z >= k and (queue[z, 4] if z < nq else items[ib + z - nq, 0]) <= 0:
            z -= 1
        while k <= z:
            if active:
                active = False
                started = True
            else:
                rem, a0, fe, ae, work, started, _ready = _item(queue, items, ib, nq, k)
            if not started and a0 != 0.0:
                ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, 0, 1, a0)
            o = 0
            if started or work > 0:
                now += rem
            else:
                o = 1
            if fe != 0.0:
                ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, o, 0, -fe)
            if ae != 0.0:
                ne = _push(ev_t, ev_o, ev_k, ev_d, ne, now, o, 1, ae)
            k += 1
    # events in (time, after, kind, insertion) order: a stable insertion sort on the first three
    for i in range(1, ne):
        t, o, kk, d = ev_t[i], ev_o[i], ev_k[i], ev_d[i]
        j = i - 1
        while j >= 0 and (ev_t[j] > t or (ev_t[j] == t and (ev_o[j] > o or (ev_o[j] == o and ev_k[j] > kk)))):
            ev_t[j + 1] = ev_t[j]
            ev_o[j + 1] = ev_o[j]
            ev_k[j + 1] = ev_k[j]
            ev_d[j + 1] = ev_d[j]
            j -= 1
        ev_t[j + 1] = t
        ev_o[j + 1] = o
        ev_k[j + 1] = kk
        ev_d[j + 1] = d
    live = 0.0
    top = -np.inf
    for i in range(ne):
        live += ev_d[i]
        if live > top:
            top = live
    w = 0
    j = k
    if active:
        out[0, 0] = np.rint(rem / TIME_Q) * TIME_Q
        out[0, 1] = 0.0
        out[0, 2] = fe
        out[0, 3] = ae
        out[0, 4] = work
        out[0, 5] = 1.0
        w = 1
        j += 1
    while j < n:
        if j < nq:
            for col in range(QCOLS):
                out[w, col] = queue[j, col]
        else:
            r = ib + j - nq
            out[w, 0] = items[r, 0]
            out[w, 1] = items[r, 1]
            out[w, 2] = items[r, 2]
            out[w, 3] = items[r, 3]
            out[w, 4] = items[r, 0]
            out[w, 5] = 0.0
        w += 1
        j += 1
    return now, top, live, w


@compiled
def _fold_tasks(head_f, head_i, head_items, tail_f, tail_i, tail_items, s, dt0, y0, split, buf_a, nq, buf_b,
                ev_t, ev_o, ev_k, ev_d):
    """run_tasks on the queue buf_a[:nq], with buf_b and the event rows as scratch: (time, offset,
    o_y, o_m1, o_m2 as run_tasks, the buffer holding the queue left, its rows)."""
    nh = head_f.shape[0]
    nt = nh + tail_f.shape[0]
    dt = dt0
    y = y0
    o_y = -np.inf
    o_m1 = -np.inf
    o_m2 = -np.inf
    for t in range(nt):
        if t < nh:
            tf, ti, items = head_f[t], head_i[t], head_items
        else:
            tf, ti, items = tail_f[t - nh], tail_i[t - nh], tail_items
        dur, top, net, nq = _compute_task(tf[0], tf, items, ti[0], ti[1], ti[2], buf_a, nq, s, buf_b,
                                          ev_t, ev_o, ev_k, ev_d)
        buf_a, buf_b = buf_b, buf_a
        top_abs = y + top
        y += net
        dt += dur
        if t < split:
            if top_abs > o_y:
                o_y = top_abs
            if t == split - 1 and split < nt:
                o_m1 = y
        elif top_abs > o_m2:
            o_m2 = top_abs
    return dt, y, o_y, o_m1, o_m2, buf_a, nq


@compiled(inline=True)
def _scratch(cap):
    """_fold_tasks's scratch for queues of up to cap rows: two queue buffers and the event rows."""
    ne_max = 3 + 3 * cap + 1
    return (np.empty((cap, QCOLS)), np.empty((cap, QCOLS)), np.empty(ne_max), np.empty(ne_max, dtype=np.int64),
            np.empty(ne_max, dtype=np.int64), np.empty(ne_max))


@compiled
def run_tasks(queue, head_f, head_i, head_items, tail_f, tail_i, tail_items, s, dt0, y0, split):
    """The compute tasks of a stage in order: the head's, then the tail's (each part's items indexed
    from its own 0). dt0, y0: the stage's time and live-byte offset before them. Returns (time,
    live-byte offset after them, max of the events of tasks[:split], the offset after task split-1
    and the max of the events of tasks[split:] (-inf where there are none, and the offset when
    split is the number of tasks), the queue left)."""
    buf_a, buf_b, ev_t, ev_o, ev_k, ev_d = _scratch(queue.shape[0] + head_items.shape[0] + tail_items.shape[0] + 1)
    for r in range(queue.shape[0]):           # element by element: a slice assignment compiles its
        for col in range(QCOLS):              # shape-mismatch message (string formatting), seconds
            buf_a[r, col] = queue[r, col]     # on a fresh machine
    dt, y, o_y, o_m1, o_m2, left, nq = _fold_tasks(head_f, head_i, head_items, tail_f, tail_i, tail_items, s, dt0,
                                                   y0, split, buf_a, queue.shape[0], buf_b, ev_t, ev_o, ev_k, ev_d)
    return dt, y, o_y, o_m1, o_m2, left[:nq].copy()


# A stage is a pending step's backward task (its head) followed by a part (fast.StagePart: the
# stage's own steps, the same for every pending step). run_stages reads both as rows of a
# stagearena.StageArena and joins them (_join); these are their columns.
# pend_f: the head's tasks_f row (work, end delta, three start deltas), then the pending step's
# own forward all-gather (0: none) and the bytes it allocates; pend_i: its items' range
PD_TASK_COLS, PD_FORWARD_GATHER, PD_GATHERED = 5, 5, 6
PEND_F_COLS = 7
PD_ITEM_BEGIN, PD_ITEM_END = 0, 1
PEND_I_COLS = 2
# part_f and part_i: StagePart's fields; part_fixed: its queue-independent deltas, quantised
PT_SLOWDOWN, PT_DT, PT_LAST_FWD, PT_DT_EXTRA, PT_O_V, PT_LAST_EVENT, PT_O_V_FLOOR, PT_Y0 = range(8)
PART_F_COLS = 8
(PT_TAIL_TASK_BEGIN, PT_TAIL_TASK_END, PT_TAIL_ITEM_BEGIN, PT_TAIL_ITEM_END, PT_EXTRA_BEGIN, PT_EXTRA_END,
 PT_EXTRA_FIRST, PT_BARRIER, PT_SPLIT, PT_NEW_PEND) = range(10)
PART_I_COLS = 10
PART_FIXED = ("opt", "s_n", "d_v", "pm", "g_a", "p_a")
# the columns of run_stages's deltas: fast.StageOut's fields after the key, in their order
STAGE_DELTAS = ("dt", "opt", "s_n", "o_v", "o_y", "d_y", "d_v", "pm", "o_m1", "o_m2", "g_a", "p_a")
_DT, _OPT, _S_N, _O_V, _O_Y, _D_Y, _D_V, _NEW_PM, _O_M1, _O_M2, _G_A, _P_A = range(12)

# fast.seg itself, compiled into run_stages: numba's cache does not see a change to fast.py
# (tests/test_costmodel_fast.py checks the compiled one against it)
_seg = compiled(seg, inline=True)


@compiled
def _fixed(x, unit, neg):
    """fast.qt / fast.qm: x in units rounded half to even (as Python's round), -inf as neg."""
    if x == -np.inf:
        return neg
    return np.int64(np.rint(x / unit))


@compiled(inline=True)
def _copy_items(items, b, e, out, w):
    """items[b:e] into out from row w; returns the next free row."""
    for r in range(b, e):
        for col in range(ICOLS):
            out[w, col] = items[r, col]
        w += 1
    return w


@compiled(inline=True)
def _join(pf, pi, qf, qi, items, head_f, head_i, head_items):
    """The head of a stage (the pending step's backward task, pend row pf / pi) before part qf / qi:
    its task row into head_f[0], its items into head_items (under "group" the part's extra items
    come first: the pending task prefetches the part's last step's gather; else its reductions
    come first and the part's re-gathers queue behind them) with the barrier on the extra items
    (the first one under "group", the last one else) into head_i[0]. Returns (items written,
    the stage's time before its backward tasks, its forward events' maximum): the part's forward
    segments, its last one paired with the pending step's gather, and its events, the last one
    with that gather's copy (fast.StagePart)."""
    for col in range(PD_TASK_COLS):
        head_f[0, col] = pf[col]
    xb, xe = qi[PT_EXTRA_BEGIN], qi[PT_EXTRA_END]
    if qi[PT_EXTRA_FIRST] != 0:
        w = _copy_items(items, xb, xe, head_items, 0)
        w = _copy_items(items, pi[PD_ITEM_BEGIN], pi[PD_ITEM_END], head_items, w)
        barrier = 0
    else:
        w = _copy_items(items, pi[PD_ITEM_BEGIN], pi[PD_ITEM_END], head_items, 0)
        w = _copy_items(items, xb, xe, head_items, w)
        barrier = w - 1
    head_i[0, 0] = 0
    head_i[0, 1] = w
    head_i[0, 2] = barrier if qi[PT_BARRIER] != 0 else -1
    dt0 = qf[PT_DT] + _seg(qf[PT_LAST_FWD], pf[PD_FORWARD_GATHER], qf[PT_SLOWDOWN]) + qf[PT_DT_EXTRA]
    o_v = max(max(qf[PT_O_V], qf[PT_LAST_EVENT] + pf[PD_GATHERED]), qf[PT_O_V_FLOOR])
    return w, dt0, o_v


@compiled
def run_stages(queues, queue_begin, queue_end, job_key, job_pend, job_part, tasks_f, tasks_i, items, pend_f,
               pend_i, part_f, part_i, part_fixed):
    """Many stages in one call: job j runs the head of pending step job_pend[j] (pend_f, pend_i)
    and then part job_part[j] (part_f, part_i: its tail's tasks tasks_f/tasks_i[tail task
    begin:end] with items[tail item begin:end], its extra items, slowdown, y0 and split as
    run_tasks) on the queue of key job_key[j] (queues[queue_begin[k]:queue_end[k]]); _join makes
    the head. Returns (deltas (jobs, 12): the stage deltas in fixed point, STAGE_DELTAS's columns,
    the queue-independent ones copied from part_fixed (PART_FIXED's columns); left (rows, 6): the
    queues left, job j's at left[left_begin[j]:left_end[j]], -0.0 written as 0.0 so that equal
    queues have equal bytes; left_begin; left_end)."""
    nj = job_key.shape[0]
    left_begin = np.empty(nj, dtype=np.int64)
    left_end = np.empty(nj, dtype=np.int64)
    total = 0
    cap_max = 1
    head_max = 1
    for j in range(nj):
        d, p = job_pend[j], job_part[j]
        nh = pend_i[d, PD_ITEM_END] - pend_i[d, PD_ITEM_BEGIN] + part_i[p, PT_EXTRA_END] - part_i[p, PT_EXTRA_BEGIN]
        cap = (queue_end[job_key[j]] - queue_begin[job_key[j]] + nh + part_i[p, PT_TAIL_ITEM_END]
               - part_i[p, PT_TAIL_ITEM_BEGIN] + 1)
        left_begin[j] = total
        total += cap
        if cap > cap_max:
            cap_max = cap
        if nh > head_max:
            head_max = nh
    left = np.empty((total, QCOLS))
    deltas = np.empty((nj, 12), dtype=np.int64)
    buf_a, buf_b, ev_t, ev_o, ev_k, ev_d = _scratch(cap_max)
    head_f = np.empty((1, 5))
    head_i = np.empty((1, 3), dtype=np.int64)
    head_items = np.empty((head_max, ICOLS))
    for j in range(nj):
        d, p = job_pend[j], job_part[j]
        q0 = queue_begin[job_key[j]]
        nq = queue_end[job_key[j]] - q0
        for r in range(nq):
            for col in range(QCOLS):
                buf_a[r, col] = queues[q0 + r, col]
        nh, dt0, o_v = _join(pend_f[d], pend_i[d], part_f[p], part_i[p], items, head_f, head_i, head_items)
        t0, t1 = part_i[p, PT_TAIL_TASK_BEGIN], part_i[p, PT_TAIL_TASK_END]
        dt, y, o_y, o_m1, o_m2, out, n_left = _fold_tasks(
            head_f, head_i, head_items[:nh],
            tasks_f[t0:t1], tasks_i[t0:t1], items[part_i[p, PT_TAIL_ITEM_BEGIN]:part_i[p, PT_TAIL_ITEM_END]],
            part_f[p, PT_SLOWDOWN], dt0, part_f[p, PT_Y0], part_i[p, PT_SPLIT],
            buf_a, nq, buf_b, ev_t, ev_o, ev_k, ev_d)
        b = left_begin[j]
        for r in range(n_left):
            for col in range(QCOLS):
                left[b + r, col] = out[r, col] + 0.0
        left_end[j] = b + n_left
        fx = part_fixed[p]
        deltas[j, _DT] = _fixed(dt, TIME_Q, NEG)
        deltas[j, _OPT] = fx[0]
        deltas[j, _S_N] = fx[1]
        deltas[j, _O_V] = _fixed(o_v, MEM_Q, NEG)
        deltas[j, _O_Y] = _fixed(o_y, MEM_Q, NEG)
        deltas[j, _D_Y] = _fixed(y, MEM_Q, NEG)
        deltas[j, _D_V] = fx[2]
        deltas[j, _NEW_PM] = fx[3]
        deltas[j, _O_M1] = _fixed(o_m1, MEM_Q, NEG)
        deltas[j, _O_M2] = _fixed(o_m2, MEM_Q, NEG)
        deltas[j, _G_A] = fx[4]
        deltas[j, _P_A] = fx[5]
    return deltas, left, left_begin, left_end
