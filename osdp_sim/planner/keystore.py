"""Keys and stage plans shared by the engines of one search.

A key (dp.py) is a value: a plain key, the tuple (pending backward step, queued communication)
of costmodel/fast.py, or one of the two markers of a checkpointed block below, around a plain
key's id. Engines of configurations that differ only in the root strategy meet the same keys and
run the same stages on them, so one store interns keys to small integer ids for all of them,
keeps each plain key's queue as fold.py's float64 rows (what the compiled stages read) and the
stage plans of the table rows (stagebatch.PlanArena)."""

from dataclasses import dataclass

import numpy as np

from osdp_sim.planner.bounds import KEY_CKMLP_DONE, KEY_COLS, KEY_DEFERRED, KEY_PLAIN, key_row
from osdp_sim.planner.stagebatch import WRAP_DEFERRED, WRAP_PLAIN, PlanArena


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
        self._pend_nos: dict = {}                    # Pending (by value) or None -> its number
        self._pends: list = []                       # number -> Pending
        self._queues: list = []                      # id -> queue rows (plain keys; None for markers)
        self._key_pend: list = []                    # id -> pending step number (plain keys; -1 for markers)
        self._rows = np.zeros((64, KEY_COLS))          # id -> key_row (bounds.py)
        self._steps_ids: dict = {}
        self.arenas: dict = {}                       # Engine.slot_class -> TableArena (tables.py)
        self.plans = PlanArena()                     # the stage plans of the arenas' row recipes

    def pend_number(self, pend) -> int:
        """The number of a pending step (fast.Pending or None), the same for equal ones."""
        n = self._pend_nos.get(pend)
        if n is None:
            n = self._pend_nos[pend] = len(self._pends)
            self._pends.append(pend)
        return n

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
        stage at a time in that order."""
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
        return np.array(out, dtype=np.int64)

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
        key = (self._pends[k[0]], queue_tuple(rows))
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
