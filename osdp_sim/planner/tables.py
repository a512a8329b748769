"""The transition tables of one search, as arrays: one TableArena per slot class.

A slot class (dp.Engine.slot_class) names everything a slot's tables depend on besides the key:
every slot of a class has the same codes, in the same order, and the same key gives the same
table there, in every engine of the search's KeyStore. So a class keeps one row per key it has
met, and the tables of all the distinct keys of a decision are one gather (`gather`) instead of
a Python loop per key."""

from dataclasses import dataclass, field

import numpy as np

from osdp_sim.arrays import grown
from osdp_sim.planner.labels import NDELTA, Table


@dataclass
class TableArena:
    """The tables of one slot class: row r holds the table of the key whose row_of is r."""

    codes: np.ndarray                                      # (entries,) the decision codes of the class
    row_of: np.ndarray = field(default_factory=lambda: np.full(64, -1, dtype=np.int64))   # key id -> row, -1 not built
    new_keys: np.ndarray = field(init=False)               # (rows, entries) key id each code leads to
    deltas: np.ndarray = field(init=False)                 # (rows, entries, NDELTA) stage deltas
    n: int = 0                                             # rows built
    recipes: dict = field(default_factory=dict)            # Engine._recipe_of's key -> stagebatch.RowRecipe

    def __post_init__(self):
        self._code_rows = np.tile(self.codes, (16, 1))     # gather's codes, one row per key (read-only)
        self.columns = np.arange(len(self.codes))           # every entry of a row
        self.column_of = {int(c): e for e, c in enumerate(self.codes.tolist())}   # code -> its entry
        self.new_keys = np.zeros((16, len(self.codes)), dtype=np.int64)
        self.deltas = np.zeros((16, len(self.codes), NDELTA), dtype=np.int64)

    def missing(self, keys: np.ndarray) -> np.ndarray:
        """The keys (distinct, as given) whose table is not built yet."""
        if len(keys) == 0:
            return keys
        self.row_of = grown(self.row_of, int(keys.max()) + 1, -1)
        return keys[self.row_of[keys] < 0]

    def row(self, key_id: int) -> int:
        """The row of key_id's table, -1 if not built."""
        return int(self.row_of[key_id]) if key_id < len(self.row_of) else -1

    def add_rows(self, key_ids: np.ndarray, new_keys: np.ndarray, deltas: np.ndarray) -> None:
        """The rows of key_ids (not built yet, distinct): new keys (keys, entries), deltas (keys, entries, NDELTA)."""
        r0, r1 = self.n, self.n + len(key_ids)
        self.new_keys = grown(self.new_keys, r1, 0)
        self.deltas = grown(self.deltas, r1, 0)
        self.new_keys[r0:r1] = new_keys
        self.deltas[r0:r1] = deltas
        self.row_of = grown(self.row_of, int(key_ids.max()) + 1, -1)
        self.row_of[key_ids] = np.arange(r0, r1)
        self.n = r1

    def gather(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The built tables of keys as labelfold.expand's arrays: deltas (keys, entries, NDELTA),
        new key ids (keys, entries; a copy, which the caller may mark -1: not taken), codes (a view
        of rows kept by the arena: not to be written)."""
        rows = self.row_of[keys]
        return self.deltas[rows], self.new_keys[rows], self.code_rows(len(keys))

    def code_rows(self, n: int) -> np.ndarray:
        """The codes as n rows (a view of rows kept by the arena: not to be written)."""
        if len(self._code_rows) < n:
            self._code_rows = np.tile(self.codes, (max(n, 2 * len(self._code_rows)), 1))
        return self._code_rows[:n]

    def table(self, key_id: int) -> Table:
        r = self.row_of[key_id]
        return Table(self.codes, self.new_keys[r], self.deltas[r])
