"""Keys and stage results shared by the engines of one search.

A key (dp.py) is a value: the pending backward step and the queued communication, or a
checkpointed block's marker around one. Engines of configurations that differ only in the root
strategy meet the same keys and run the same stages on them, so one store interns keys to ids
for all of them and keeps every stage result under small integer ids (hashing a key or a tuple
of steps costs more than most stage lookups save)."""

import numpy as np

from osdp_sim.planner.bounds import KEY_COLS, key_row


class KeyStore:
    def __init__(self):
        self.keys: list[tuple] = []                  # id -> key
        self._ids: dict = {}
        self._rows = np.zeros((64, KEY_COLS))          # id -> key_row (bounds.py)
        self._steps_ids: dict = {}
        self.stages: dict = {}                       # (key id, steps id, kind, s, ck, pm_sum) -> (deltas, new key id)
        self._queue_rows: dict = {}                  # key id -> its queue as fold.py's rows

    def intern(self, key: tuple) -> int:
        i = self._ids.get(key)
        if i is None:
            i = len(self.keys)
            self._ids[key] = i
            self.keys.append(key)
            if i == len(self._rows):
                self._rows = np.concatenate([self._rows, np.zeros_like(self._rows)])
            if key[0] == "C":
                self._rows[i] = key_row(1, *self.keys[key[1]])
            elif key[0] == "D":
                self._rows[i] = key_row(2, *self.keys[key[1]], key[2])
            else:
                self._rows[i] = key_row(0, *key)
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
