"""Keys and stage parts shared by the engines of one search.

A key (dp.py) is a value: a plain key, the tuple (pending backward step, queued communication)
of costmodel/fast.py, or one of the two markers of a checkpointed block below, around a plain
key's id. Engines of configurations that differ only in the root strategy meet the same keys and
run the same stages on them, so one store interns keys to small integer ids for all of them,
keeps each plain key's queue as fold.py's float64 rows (what the compiled stages read) and the
pending steps and stage parts of the table rows (costmodel/stagearena.StageArena)."""

from dataclasses import dataclass

import numpy as np

from osdp_sim.costmodel.stagearena import StageArena
from osdp_sim.jit import compiled
from osdp_sim.planner.bounds import KEY_CKMLP_DONE, KEY_COLS, KEY_DEFERRED, KEY_PLAIN, key_row
from osdp_sim.planner.stagebatch import WRAP_CKMLP_DONE, WRAP_DEFERRED, WRAP_PLAIN


@dataclass(frozen=True, slots=True)
class CkMlpDone:
    """The key after a checkpointed block's MLP was evaluated ahead of its attention ("ckmlp",
    fast.mlp_first): the attention's decision runs its "ckattn" stage on the inner key."""

    key_id: int          # the plain key the MLP's stage left


@dataclass(frozen=True, slots=True)
class DeferredMlp:
    """A checkpointed block's MLP choice only recorded: the whole block is evaluated when its
    attention is chosen ("ckpt" stage), the recompute needing both groups."""

    key_id: int          # the plain key before the MLP decision
    choice: int          # the MLP's choice (an index into Problem.choices)


class KeyStore:
    """Plain keys are interned by (their pending step's number, the bytes of their queue's rows):
    the pending steps by value (pend_number), the queues as fold.py's float64 rows with -0.0
    written as 0.0, so equal tuples of queue items give equal bytes."""

    def __init__(self):
        self.keys: list = []                         # id -> key: a plain key tuple, CkMlpDone or DeferredMlp
        self._done_ids: dict = {}                    # inner key id -> id of its CkMlpDone
        self._deferred_ids: dict = {}                # (inner key id, choice) -> id of its DeferredMlp
        self._plain_ids: dict = {}                   # (pending step number, queue rows' bytes) -> id
        self._queues: list = []                      # id -> queue rows (plain keys; None for markers)
        self._key_pend: list = []                    # id -> pending step number (plain keys; -1 for markers)
        self._rows = np.zeros((64, KEY_COLS))          # id -> key_row (bounds.py)
        self._steps_ids: dict = {}
        self.arenas: dict = {}                       # Engine.slot_class -> TableArena (tables.py)
        self.stages = StageArena()                   # the pending steps (numbered) and stage parts of the row recipes

    def pend_number(self, pend) -> int:
        """The number of a pending step (fast.Pending or None), the same for equal ones."""
        return self.stages.pend_number(pend)

    def pend_number_of(self, key_id: int) -> int:
        """The pending step number of a plain key."""
        return self._key_pend[key_id]

    def intern(self, key) -> int:
        """The id of a key, the same for every equal key."""
        if isinstance(key, CkMlpDone):
            return self.intern_done(key.key_id)
        if isinstance(key, DeferredMlp):
            return self.intern_deferred(key.key_id, key.choice)
        pend, queue = key
        return self.intern_plain(self.pend_number(pend), queue)

    def intern_plain(self, pend_no: int, queue: tuple) -> int:
        """The id of the plain key (the pending step numbered pend_no, queue)."""
        from osdp_sim.costmodel.fold import queue_array
        return self.intern_rows(pend_no, queue_array(queue))

    def intern_rows(self, pend_no: int, rows: np.ndarray) -> int:
        """intern_plain of a queue given as fold.py's rows (copied)."""
        rows = rows + 0.0
        k = (pend_no, rows.tobytes())
        i = self._plain_ids.get(k)
        return self._add_plain(k, rows) if i is None else i

    def intern_new_keys(self, keys: np.ndarray, wrap: np.ndarray, choice: np.ndarray, pend_nos: np.ndarray,
                        left: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
        """The new key ids of table rows (stagebatch.run_rows): entry (k, e) is, by wrap[k, e]
        (stagebatch's WRAP_*), the plain key of the next job (pending step number pend_nos[j], queue
        left[begin[j]:end[j]], jobs in the order of the entries with a stage), CkMlpDone of it, or
        DeferredMlp(keys[k], choice[k, e]). Interned in row-major order, so the ids are those of one
        stage at a time in that order (intern_new_keys_each's, one entry at a time).

        Most jobs of a call leave a queue another job left too (mingpt-48l-1536's search: 469 k
        jobs, 20 k distinct per call), so the jobs are grouped by a hash of their queue, compiled,
        checked bit for bit against the first of their group, and only the groups are looked up;
        a hash shared by two different queues sends the call to intern_new_keys_each."""
        left = np.ascontiguousarray(left)
        words = left.view(np.int64) if left.size else np.zeros((0, 1), dtype=np.int64)
        pend_nos, begin, end = (np.ascontiguousarray(a, dtype=np.int64) for a in (pend_nos, begin, end))
        h = _queue_hashes(words, pend_nos, begin, end)
        _, first, inv = np.unique(h, return_index=True, return_inverse=True)
        inv = inv.reshape(-1)
        if not _same_as_first(words, pend_nos, begin, end, first[inv]):
            return self.intern_new_keys_each(keys, wrap, choice, pend_nos, left, begin, end)
        flat_wrap = wrap.reshape(-1)
        job_entry = np.flatnonzero(flat_wrap != WRAP_DEFERRED)
        def_entry = np.flatnonzero(flat_wrap == WRAP_DEFERRED)
        # each distinct plain key (group r): its id if known, else created at its first entry
        get = self._plain_ids.get
        pkeys = [(p, left[b:e].tobytes()) for p, b, e in zip(pend_nos[first].tolist(), begin[first].tolist(),
                                                               end[first].tolist())]
        pid = [get(k) for k in pkeys]
        events = [(int(job_entry[j]), 0, r) for r, (j, i) in enumerate(zip(first.tolist(), pid)) if i is None]
        # CkMlpDone of a group: known when its plain key and its marker are
        done_job = np.flatnonzero(flat_wrap[job_entry] == WRAP_CKMLP_DONE)
        done_r, done_first = np.unique(inv[done_job], return_index=True)
        did = {}
        for r, j in zip(done_r.tolist(), done_first.tolist()):
            i = pid[r]
            d = None if i is None else self._done_ids.get(i)
            if d is None:
                events.append((int(job_entry[done_job[j]]), 1, r))
            else:
                did[r] = d
        # DeferredMlp of (the row's key, the choice)
        ncols = wrap.shape[1]
        pairs = np.stack([np.asarray(keys, dtype=np.int64)[def_entry // ncols],
                          np.asarray(choice).reshape(-1)[def_entry].astype(np.int64)], axis=1)
        if len(pairs):
            dpairs, dfirst, dinv = np.unique(pairs, axis=0, return_index=True, return_inverse=True)
            dinv = dinv.reshape(-1)
        else:
            dpairs, dfirst, dinv = pairs, np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        fid = np.empty(len(dpairs), dtype=np.int64)
        for q, ((kid, c), j) in enumerate(zip(dpairs.tolist(), dfirst.tolist())):
            i = self._deferred_ids.get((kid, c))
            if i is None:
                events.append((int(def_entry[j]), 2, q))
            else:
                fid[q] = i
        # the new ids in the order one entry at a time creates them
        for _entry, kind, x in sorted(events):
            if kind == 0:
                j = int(first[x])
                b, e = int(begin[j]), int(end[j])
                pid[x] = self._add_plain(pkeys[x], left[b:e].copy())
            elif kind == 1:
                did[x] = self.intern_done(pid[x])
            else:
                kid, c = dpairs[x].tolist()
                fid[x] = self.intern_deferred(kid, c)
        out = np.empty(len(flat_wrap), dtype=np.int64)
        pid_a = np.array(pid, dtype=np.int64)
        job_ids = pid_a[inv]
        if len(done_job):
            did_a = np.zeros(len(pid_a), dtype=np.int64)
            did_a[np.array(list(did), dtype=np.int64)] = list(did.values())
            job_ids[done_job] = did_a[inv[done_job]]
        out[job_entry] = job_ids
        out[def_entry] = fid[dinv]
        return out.reshape(wrap.shape)

    def intern_new_keys_each(self, keys: np.ndarray, wrap: np.ndarray, choice: np.ndarray, pend_nos: np.ndarray,
                             left: np.ndarray, begin: np.ndarray, end: np.ndarray) -> np.ndarray:
        """intern_new_keys one entry at a time (its reference, and its way on a hash collision)."""
        raw = np.ascontiguousarray(left).tobytes()
        w = left.shape[1] * left.itemsize
        get = self._plain_ids.get
        jobs = zip(pend_nos.tolist(), begin.tolist(), end.tolist())
        out = []
        for key_id, wraps, choices in zip(keys.tolist(), wrap.tolist(), choice.tolist()):
            row = []
            for wr, c in zip(wraps, choices):
                if wr == WRAP_DEFERRED:
                    row.append(self.intern_deferred(key_id, c))
                    continue
                p, b, e = next(jobs)
                k = (p, raw[b * w:e * w])
                i = get(k)
                if i is None:
                    i = self._add_plain(k, left[b:e].copy())
                row.append(i if wr == WRAP_PLAIN else self.intern_done(i))
            out.append(row)
        return np.array(out, dtype=np.int64).reshape(wrap.shape)

    def intern_done(self, key_id: int) -> int:
        i = self._done_ids.get(key_id)
        if i is None:
            i = self._done_ids[key_id] = self._add(CkMlpDone(key_id), None, -1,
                                                  key_row(KEY_CKMLP_DONE, *self.keys[key_id]))
        return i

    def intern_deferred(self, key_id: int, choice: int) -> int:
        i = self._deferred_ids.get((key_id, choice))
        if i is None:
            i = self._deferred_ids[(key_id, choice)] = self._add(DeferredMlp(key_id, choice), None, -1,
                                                                key_row(KEY_DEFERRED, *self.keys[key_id], choice))
        return i

    def _add_plain(self, k: tuple, rows: np.ndarray) -> int:
        from osdp_sim.costmodel.fold import queue_tuple
        key = (self.stages.pends[k[0]], queue_tuple(rows))
        i = self._add(key, rows, k[0], key_row(KEY_PLAIN, *key))
        self._plain_ids[k] = i
        return i

    def _add(self, key, rows, pend_no: int, row: tuple) -> int:
        i = len(self.keys)
        self.keys.append(key)
        self._queues.append(rows)
        self._key_pend.append(pend_no)
        if i == len(self._rows):
            self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
        self._rows[i] = row
        return i

    @property
    def rows(self) -> np.ndarray:
        """(number of keys, KEY_COLS): what the bounds read of each key."""
        return self._rows[:len(self.keys)]

    def steps_id(self, steps: tuple) -> int:
        return self._steps_ids.setdefault(steps, len(self._steps_ids))

    def queue_rows(self, key_id: int) -> np.ndarray:
        """The queue of a plain key as fold.py's float64 rows (not to be written)."""
        return self._queues[key_id]


@compiled
def _queue_hashes(words, pend_nos, begin, end):
    """Per job: FNV-1a over its pending step number and the 64-bit words of its queue's rows."""
    n = len(pend_nos)
    out = np.empty(n, dtype=np.uint64)
    prime = np.uint64(1099511628211)
    for j in range(n):
        h = np.uint64(14695981039346656037)
        h = (h ^ np.uint64(pend_nos[j])) * prime
        h = (h ^ np.uint64(end[j] - begin[j])) * prime
        for r in range(begin[j], end[j]):
            for c in range(words.shape[1]):
                h = (h ^ np.uint64(words[r, c])) * prime
        out[j] = h
    return out


@compiled
def _same_as_first(words, pend_nos, begin, end, rep):
    """Whether every job's pending step and queue equal, bit for bit, those of job rep[j]."""
    for j in range(len(pend_nos)):
        q = rep[j]
        if pend_nos[j] != pend_nos[q] or end[j] - begin[j] != end[q] - begin[q]:
            return False
        for r in range(end[j] - begin[j]):
            for c in range(words.shape[1]):
                if words[begin[j] + r, c] != words[begin[q] + r, c]:
                    return False
    return True
