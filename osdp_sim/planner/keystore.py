"""Keys and stage results shared by the engines of one search.

A key (dp.py) is a value: a plain key, the tuple (pending backward step, queued communication)
of costmodel/fast.py, or one of the two markers of a checkpointed block below, around a plain
key's id. Engines of configurations that differ only in the root
strategy meet the same keys and run the same stages on them, so one store interns keys to ids
for all of them and keeps every stage result under small integer ids (hashing a key or a tuple
of steps costs more than most stage lookups save)."""

from dataclasses import dataclass

import numpy as np

from osdp_sim.planner.bounds import KEY_CKMLP_DONE, KEY_COLS, KEY_DEFERRED, KEY_PLAIN, key_row


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
    def __init__(self):
        self.keys: list = []                         # id -> key: a plain key tuple, CkMlpDone or DeferredMlp
        self._ids: dict = {}
        self._rows = np.zeros((64, KEY_COLS))          # id -> key_row (bounds.py)
        self._steps_ids: dict = {}
        self.stages: dict = {}                       # (key id, steps id, kind, s, ck, pm_sum) -> (deltas, new key id)
        self._queue_rows: dict = {}                  # key id -> its queue as fold.py's rows
        self.arenas: dict = {}                       # Engine.slot_class -> TableArena (tables.py)

    def intern(self, key) -> int:
        """The id of a key, the same for every equal key."""
        i = self._ids.get(key)
        if i is None:
            i = len(self.keys)
            self._ids[key] = i
            self.keys.append(key)
            if i == len(self._rows):
                self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
            if isinstance(key, CkMlpDone):
                self._rows[i] = key_row(KEY_CKMLP_DONE, *self.keys[key.key_id])
            elif isinstance(key, DeferredMlp):
                self._rows[i] = key_row(KEY_DEFERRED, *self.keys[key.key_id], key.choice)
            else:
                self._rows[i] = key_row(KEY_PLAIN, *key)
        return i

    @property
    def rows(self) -> np.ndarray:
        """(number of keys, KEY_COLS): what the bounds read of each key."""
        return self._rows[:len(self.keys)]

    def steps_id(self, steps: tuple) -> int:
        return self._steps_ids.setdefault(steps, len(self._steps_ids))

    def queue_rows(self, key_id: int):
        """The queue of a (pending, queue) key as fold.py's float64 rows, built once per key."""
        q = self._queue_rows.get(key_id)
        if q is None:
            from osdp_sim.costmodel.fold import queue_array
            q = self._queue_rows[key_id] = queue_array(self.keys[key_id][1])
        return q
