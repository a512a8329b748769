"""Exact search of one configuration: label setting over decisions in backward order, with
dominance between partial plans that share a key and bound pruning.

Decisions, in order: for the last block down to the first, its MLP group (choice, checkpointed?)
then its attention group; the embedding (nothing to choose) closes the plan. A checkpointed
block is evaluated when its attention group is chosen (the recompute needs both groups), so an
MLP decision with checkpointing only records the choice in the key (keystore.DeferredMlp), unless
its MLP can run first (keystore.CkMlpDone).

A label is a row (t, U, V, Y, PM, M1, M2) in fixed point (costmodel/fast.py; labels.py names
the columns). Its future depends only on its key: the pending step, the reductions still queued
and the deferred choice. Every stage update
is monotone in each component (sums with constants and maxima), and the final (time, peak) is
(t, max(U, Y + PM)), so a label whose components are all <= another's with the same key yields,
under every completion, a plan no slower and no larger: the other can be dropped (kept when
top-k asks for k plans: a label is dropped only when k others dominate it). Fixed-point integers
make the sums independent of the order of addition, so blocks of the same shape that differ only
by position produce identical labels when their choices are permuted, and merge.
"""

import time
from dataclasses import dataclass

import numpy as np

from osdp_sim.costmodel.fast import mlp_first, start_label
from osdp_sim.costmodel.lowering import optimizer_temp_sums
from osdp_sim.planner.bounds import Bounds
from osdp_sim.planner.front import FrontStairs, lambda_pruned
from osdp_sim.planner.keygraph import GraphCaps, KeyGraph, Timeout, TooLarge, lambda_grid
from osdp_sim.planner.keystore import CkMlpDone, DeferredMlp, KeyStore
from osdp_sim.planner.labels import (DT, NCOL, OPT, S_N, T, Table, U, expand, label_row, peaks, run_starts, sort_by_key,
                                     unique_inverse)
from osdp_sim.planner.merged import MergedView, grid_for
from osdp_sim.planner.problem import Problem
from osdp_sim.planner.stagebatch import NO_STAGE, WRAP_CKMLP_DONE, WRAP_DEFERRED, WRAP_PLAIN, RowRecipe, run_one, run_rows
from osdp_sim.planner.tables import TableArena


def positions_of(pb: Problem) -> list[tuple[str, int]]:
    """The decisions in search order, as (kind, block index). Slot g is the point before decision
    g: a label at slot g has made decisions 0 .. g-1 and waits for positions[g]."""
    out = []
    for b in range(len(pb.blocks) - 1, -1, -1):
        out.append(("mlp", b))
        out.append(("attn", b))
    out.append(("embed", -1))
    return out


PARETO_CHUNK_ROWS = 200_000       # rows between deadline checks of the dominance filter
ROWS_PER_CALL = 256               # table rows per compiled call (its memory: rows x codes x queue)
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_H = np.zeros((1, 1))
_NO_M = np.zeros(1)


class _Timeout(Exception):
    """The deadline passed while a decision was being expanded."""


@dataclass
class Finished:
    t_q: int
    peak_q: int
    attn: list[int]
    mlp: list[int]
    ckpt: list[bool]


@dataclass
class DPStats:
    nodes: int = 0                # labels created (before pruning)
    kept: int = 0                 # labels kept after pruning and dominance
    pruned_bound: int = 0
    pruned_memory: int = 0
    dominated: int = 0


@dataclass
class DPResult:
    finished: list[Finished]
    stats: DPStats
    complete: bool
    open_bound_q: float           # least time lower bound among labels left when stopped
    seconds: float


class Engine:
    """Transition tables of one problem, shared by every run on it."""

    def __init__(self, pb: Problem, store: KeyStore | None = None):
        """store: keys and stage results shared with other engines (keystore.py)."""
        self.pb = pb
        self.store = KeyStore() if store is None else store
        self.keys = self.store.keys                 # id -> key
        self.intern = self.store.intern
        self.positions = positions_of(pb)
        self.bounds = Bounds(pb, self.positions)
        self.arenas = self.store.arenas             # slot class -> TableArena (tables.py), shared
        self._front_sm: dict = {}                   # _front_pruned's suffix maxima of the front last seen
        self.single: dict = {}                      # (key id, slot class, code) -> path()'s stage: (new key id, deltas)
        self._sids = [[self.store.steps_id(o.steps) for o in opts] for opts in pb.shapes]
        self._sid_embed = self.store.steps_id((pb.root.embed,))
        self.stage_sims = 0                         # stages folded: table entries with a stage, single stages
        self.pm_sum = optimizer_temp_sums(pb.hw, pb.cfg.optimizer)   # how labels combine PM
        self.graph: KeyGraph | None = None          # exact time-to-go (keygraph.py), once built
        self.too_large_real: list = []              # (limit, threshold, caps) of abandoned graphs
        self.too_large_merged: list = []
        nchoice = len(pb.choices)
        self.codes_nc = list(range(nchoice)) if False in pb.ckpt_options else []
        self.codes_ck = list(range(nchoice, 2 * nchoice)) if True in pb.ckpt_options else []
        self._slot_classes = [self._class_of(g) for g in range(len(self.positions))]

    def build_graph(self, pq_max: float, thr_q: float = float("inf"), deadline: float | None = None,
                    caps: GraphCaps = GraphCaps(), merged_ok: bool = True) -> str:
        """Build the key graph (keygraph.py) for runs with limit <= pq_max and threshold <= thr_q;
        graph_for() returns it from then on. Over real keys if it fits the caps, else (merged_ok)
        over merged keys (merged.py). Returns "built" (or already there), "too large" (the search
        then keeps the relaxed bounds) or "deadline"."""
        g = self.graph
        if g is not None and g.covers(pq_max, thr_q) and (merged_ok or g.view is None):
            return "built"
        out = self._attempt(self, self.too_large_real, pq_max, thr_q, deadline, caps)
        if out != "too large" or not merged_ok:
            return out
        # too many real keys (communication-bound chains): the graph over merged keys
        view = MergedView(self, grid_for(self, pq_max))
        return self._attempt(view, self.too_large_merged, pq_max, thr_q, deadline, caps)

    def _attempt(self, source, tried: list, pq_max, thr_q, deadline, caps) -> str:
        """One KeyGraph over the transitions of `source` (this engine, or a MergedView of it)."""
        if _abandoned(tried, pq_max, thr_q, caps):
            return "too large"
        try:
            graph = KeyGraph(source, lambda_grid(self.bounds.j_lam), pq_max, thr_q, deadline, caps)
        except Timeout:
            return "deadline"
        except TooLarge:
            tried.append((pq_max, thr_q, caps))
            return "too large"
        self.graph = graph
        return "built"

    def graph_for(self, pq_max: float, thr_q: float) -> KeyGraph | None:
        """The key graph if it is valid for a run with this limit and threshold, else None."""
        g = self.graph
        return g if g is not None and g.covers(pq_max, thr_q) else None

    @property
    def key_rows(self) -> np.ndarray:
        """(number of keys, KEY_COLS): what the bounds read of each key."""
        return self.store.rows

    def start(self) -> tuple[np.ndarray, np.ndarray]:
        """The one label before any decision (the head's backward pending) and its key id."""
        pb = self.pb
        key0, lab0 = start_label(pb.root.head, pb.m, pb.s)
        L = np.array([label_row(lab0)], dtype=np.int64)
        return L, np.array([self.intern(key0)], dtype=np.int64)

    # ---- transitions -------------------------------------------------------------------
    def _stage(self, key_id: int, g: int, code: int) -> tuple[int, tuple]:
        """New key and deltas (labels.py's columns) of the decision at slot g taking `code`."""
        a = self.arena(g)
        e = a.column_of[code]
        r = a.row(key_id)
        if r >= 0:
            return int(a.new_keys[r, e]), tuple(a.deltas[r, e].tolist())
        inner, r = self._recipe_of(a, g, key_id)     # one stage, not the row: path() meets keys no run makes
        self.stage_sims += int(r.part[e] != NO_STAGE)
        return run_one(self.store, key_id, inner, r, e)

    def _recipe_of(self, a: TableArena, g: int, key_id: int) -> tuple[int, RowRecipe]:
        """(the plain key whose queue the stages of key_id's row at slot g run on, the row's recipe).
        A recipe depends on the slot class, the pending step and the key's kind (a DeferredMlp's
        choice): its arena keeps it for every key alike."""
        key = self.keys[key_id]
        if isinstance(key, DeferredMlp):
            inner, kind = key.key_id, ("deferred", key.choice)
        elif isinstance(key, CkMlpDone):
            inner, kind = key.key_id, ("ckmlp done",)
        else:
            inner, kind = key_id, ("plain",)
        vk = (self.store.pend_number_of(inner),) + kind
        r = a.recipes.get(vk)
        if r is None:
            r = a.recipes[vk] = self._recipe(g, a.codes, self.keys[inner][0], key)
        return inner, r

    def _recipe(self, g: int, codes: np.ndarray, pend, key) -> RowRecipe:
        """The stage of each code at slot g from a key with pending step `pend` (the decision rules
        of the module's docstring: a checkpointed MLP recorded, run first, or the whole block)."""
        pb = self.pb
        kind, bi = self.positions[g]
        nchoice = len(pb.choices)
        stages, wraps, choices = [], [], []
        for code in codes.tolist():
            wrap, choice = WRAP_PLAIN, -1
            if kind == "embed":
                st = ((pb.root.embed,), "embed", 0.0)
            elif kind == "mlp":
                b = pb.blocks[bi]
                c = code % nchoice
                steps = pb.shapes[b.mlp_shape][c].steps
                if code < nchoice:
                    st = (steps, "group", 0.0)
                elif mlp_first(steps, pend):
                    st, wrap = (steps, "ckmlp", b.ck), WRAP_CKMLP_DONE
                else:                                       # checkpointed: the whole block later
                    st, wrap, choice = None, WRAP_DEFERRED, c
            else:
                b = pb.blocks[bi]
                steps = pb.shapes[b.attn_shape][code].steps
                if isinstance(key, DeferredMlp):
                    st = (steps + pb.shapes[b.mlp_shape][key.choice].steps, "ckpt", b.ck)
                elif isinstance(key, CkMlpDone):
                    st = (steps, "ckattn", b.ck)
                else:
                    st = (steps, "group", 0.0)
            stages.append(st)
            wraps.append(wrap)
            choices.append(choice)
        return RowRecipe(self.store.pend_number(pend), stages, np.array(wraps, dtype=np.int64),
                         np.array(choices, dtype=np.int64), pb.s, self.pm_sum)

    def slot_class(self, g: int) -> tuple:
        """What slot g's tables depend on besides the key (its decision kind, the steps of its
        choices by the store's ids, the checkpoint bytes, the codes, the overlap slowdown and how
        the optimizer temporaries add up): equal for the engines of configurations that differ
        only in the root strategy, which therefore share their tables (KeyStore.arenas)."""
        return self._slot_classes[g]

    def _class_of(self, g: int) -> tuple:
        kind, bi = self.positions[g]
        if kind == "embed":
            return kind, self._sid_embed, self.pb.s, self.pm_sum
        b = self.pb.blocks[bi]
        codes = self.codes_nc + self.codes_ck if kind == "mlp" else list(range(len(self.pb.choices)))
        return (kind, tuple(self._sids[b.attn_shape]), tuple(self._sids[b.mlp_shape]), b.ck, tuple(codes),
                self.pb.s, self.pm_sum)

    def arena(self, g: int) -> TableArena:
        """The TableArena of slot g's class."""
        cls = self.slot_class(g)
        a = self.arenas.get(cls)
        if a is None:
            codes = [0] if cls[0] == "embed" else cls[4]
            a = self.arenas[cls] = TableArena(np.array(codes, dtype=np.int64))
        return a

    def tables(self, keys: np.ndarray, g: int, deadline: float | None = None, timeout=None):
        """The transitions of the distinct key ids `keys` at slot g, as labelfold.expand's arrays
        (TableArena.gather), built where missing (table_rows)."""
        return self.table_rows(keys, g, deadline, timeout)[0].gather(keys)

    def table_rows(self, keys: np.ndarray, g: int, deadline: float | None = None, timeout=None):
        """The TableArena of slot g with the tables of the distinct key ids `keys` built where
        missing (ROWS_PER_CALL rows per compiled call, stagebatch.run_rows), and each key's row in
        it. deadline: raise `timeout` past it, checked between calls."""
        a = self.arena(g)
        miss = a.missing(keys)
        for lo in range(0, len(miss), ROWS_PER_CALL):
            if deadline is not None and lo and time.perf_counter() > deadline:
                raise timeout or _Timeout
            chunk = miss[lo:lo + ROWS_PER_CALL]
            inner, recipes = zip(*(self._recipe_of(a, g, int(k)) for k in chunk))
            new_keys, deltas, sims = run_rows(self.store, chunk, list(inner), list(recipes), a.columns)
            a.add_rows(chunk, new_keys, deltas)
            self.stage_sims += sims
        return a, a.row_of[keys]

    def table(self, key_id: int, g: int) -> Table:
        """The transitions (labels.Table) of key_id at slot g: one entry per code allowed there."""
        self.tables(np.array([key_id], dtype=np.int64), g)
        return self.arena(g).table(key_id)

    def lower_bounds(self, g: int, C: np.ndarray, CK: np.ndarray, pq_max: float,
                     graph: KeyGraph | None = None, CM: np.ndarray | None = None):
        """(time lower bound, memory lower bound) of labels C with keys CK at slot g.
        graph: a KeyGraph valid for this limit and the caller's threshold (graph_for) to tighten
        them with; a graph over merged keys (merged.py) is read at the labels' own merged ids CM
        (without them it is not used)."""
        kinv, KC, KM, graph, rows = self._bound_inputs(g, CK, graph, CM)
        return self._label_bounds(g, C, kinv, KC, KM, pq_max, graph, rows)

    def _bound_inputs(self, g: int, CK: np.ndarray, graph: KeyGraph | None, CM: np.ndarray | None):
        """(kinv, KC, KM, graph, rows) for labels of keys CK at slot g: each label's row of the
        key terms KC (keys, J) and KM (keys,), and the graph with the labels' rows in it (None,
        no rows, where it cannot be read: a merged graph without merged ids CM)."""
        ukey, kinv = unique_inverse(CK)
        KC, KM = self._key_terms(g, ukey)
        if graph is None or (graph.view is not None and CM is None):
            return kinv, KC, KM, None, _NO_ROWS
        # both bounds are valid; the graph's is the tighter one almost everywhere
        return kinv, KC, KM, graph, graph.rows_of(g, CK if graph.view is None else CM)

    def _bound_args(self, pq_max: float, graph: KeyGraph | None, g: int):
        """The arguments of labelbounds.label_bounds and labelsettle.settle after the labels and
        their rows: the lambdas, the limit, the margins and the key graph's arrays at slot g (graph
        None: not read)."""
        bnd = self.bounds
        if graph is not None:
            H, Mg, lams = graph.H[g], graph.M[g], graph.lams
        else:
            H, Mg, lams = _NO_H, _NO_M, _NO_M
        finite = bool(np.isfinite(pq_max))
        # the undecided steps may add at most pq_max - U bytes (U' >= U + S_N)
        return (bnd.j_lam, float(pq_max) if finite else 0.0, finite, float(bnd.m_margin), float(bnd.t_margin),
                np.asarray(H, dtype=np.float64), np.asarray(lams, dtype=np.float64), np.asarray(Mg, dtype=np.float64),
                graph is not None)

    def _label_bounds(self, g, C, kinv, KC, KM, pq_max, graph, rows, stop_at=float("inf")):
        """lower_bounds at slot g given each label's row kinv of the key terms KC, KM and (graph
        not None) its row `rows` of the graph; a time bound >= stop_at is only known to be that
        (labelbounds.time_bound)."""
        from osdp_sim.planner.labelbounds import label_bounds
        j_lam, pq, finite, m_margin, t_margin, H, lams, Mg, use_graph = self._bound_args(pq_max, graph, g)
        return label_bounds(np.ascontiguousarray(C, dtype=np.int64), _int64(kinv), np.asarray(KC, dtype=np.float64),
                            np.asarray(KM, dtype=np.float64), j_lam, pq, finite, m_margin, t_margin, H,
                            _int64(rows), lams, Mg, use_graph, float(stop_at))

    def _settle(self, g, C, CK, kinv, KC, KM, pq_max, graph, rows, thr_q, memory_only, top_k, deadline):
        """labelsettle.settle of a decision's new labels C at slot g (kinv, rows: each label's
        row of the key terms and of the graph, read when graph is not None): (rows kept, their
        beam ranks, pruned by memory, by time, dominated). Past PARETO_CHUNK_ROWS labels the
        dominance runs in chunks of keys (pareto_by_key, which reads the keys CK), the deadline
        checked between them; the compiled calls group labels by their key's rank kinv."""
        from osdp_sim.planner.labelsettle import prune_sort, settle
        args = (np.ascontiguousarray(C, dtype=np.int64), _int64(kinv), _int64(rows),
                np.asarray(KC, dtype=np.float64), np.asarray(KM, dtype=np.float64),
                *self._bound_args(pq_max, graph, g), float(thr_q), bool(memory_only))
        if len(C) <= PARETO_CHUNK_ROWS:
            return settle(*args, int(top_k))
        order, rank, n_memory, n_bound = prune_sort(*args)
        if deadline is not None and time.perf_counter() > deadline:
            raise _Timeout
        keep = pareto_by_key(C[order], CK[order], top_k, deadline)
        return order[keep], rank[keep], n_memory, n_bound, int(len(order) - np.count_nonzero(keep))

    def _key_terms(self, g: int, ukey: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Bounds.key_terms of the key ids ukey at slot g (compiled: computing them again costs
        less than keeping them per slot and looking them up)."""
        return self.bounds.key_terms(g, self.key_rows[ukey])

    # ---- the search --------------------------------------------------------------------------
    def run(self, *, thr_q: float = float("inf"), pq_max: float = float("inf"), top_k: int = 1,
            deadline: float | None = None, keep_finished: bool = True,
            beam: int | None = None, thr_fn=None, memory_only: bool = False,
            max_nodes: int | None = None, front: FrontStairs | None = None) -> DPResult:
        """Labels whose time bound is >= thr_q or whose memory bound exceeds pq_max are pruned.
        beam: keep only that many labels (least time bound first) per decision: a heuristic, not
        exact; the search uses it to find an incumbent. thr_fn(mem_lb) -> per-label time
        threshold (the Pareto search: a label is pruned when a known plan of no more memory is
        at least as fast). front: the Pareto search's plans found so far (front.py), which prune
        a label by its memory bound's threshold and by each line of its time bound (in place of
        thr_fn). memory_only: dominance ignores time (least-peak search). max_nodes:
        stop (incomplete) once more labels than that were created: a deterministic budget."""
        t0 = time.perf_counter()
        stats = DPStats()
        if front is not None:
            thr_fn = front.threshold
        graph = self.graph_for(pq_max, thr_q if thr_fn is None else float("inf"))
        L, K = self.start()
        M = K.copy()                                            # merged ids (merged.py): the start's own
        history: list[tuple[np.ndarray, np.ndarray]] = []      # per slot: (parent, code) of kept labels
        n = len(self.positions)
        for g in range(n):
            if (deadline is not None and time.perf_counter() > deadline) or \
                    (max_nodes is not None and stats.nodes > max_nodes):
                lb = self._open_bound(g, L, K, pq_max, graph, M)
                return DPResult([], stats, False, lb, time.perf_counter() - t0)
            try:
                L2, K2, parent, code, M2 = self._expand(g, L, K, thr_q, pq_max, top_k, stats, beam, thr_fn,
                                                        memory_only, deadline, graph, M, front)
            except _Timeout:
                lb = self._open_bound(g, L, K, pq_max, graph, M)
                return DPResult([], stats, False, lb, time.perf_counter() - t0)
            L, K, M = L2, K2, M2
            history.append((parent, code))
            if len(L) == 0:
                break
        finished = []
        if len(L) and keep_finished:
            peak = peaks(L)
            for i in range(len(L)):
                finished.append(self._trace(i, history, int(L[i, T]), int(peak[i])))
        return DPResult(finished, stats, True, float("inf"), time.perf_counter() - t0)

    def path(self, attn: list[int], mlp: list[int], ckpt: list[bool]):
        """One plan through the same tables: [(slot, label row (1, NCOL), key id)] and the final
        (t_q, peak_q) (path_end). For tests of the bounds and tables."""
        Ls, kids = self._path_labels(attn, mlp, ckpt)
        return [(g, Ls[g:g + 1], k) for g, k in enumerate(kids)], (int(Ls[-1, T]), int(peaks(Ls[-1:])[0]))

    def path_end(self, attn: list[int], mlp: list[int], ckpt: list[bool]) -> tuple[int, int]:
        """The final (t_q, peak_q) of one plan through the same tables: the uniform plans'
        incumbents and the nested search's plans (bnb.py)."""
        Ls, _kids = self._path_labels(attn, mlp, ckpt)
        return int(Ls[-1, T]), int(peaks(Ls[-1:])[0])

    def _path_labels(self, attn: list[int], mlp: list[int], ckpt: list[bool]):
        """The labels (one row per slot and the last) of one plan and the key id at each slot."""
        from osdp_sim.planner.labelfold import update_chain
        pb = self.pb
        L, K = self.start()
        kid = int(K[0])
        nch = len(pb.choices)
        kids, deltas = [], []
        for g, (kind, bi) in enumerate(self.positions):
            kids.append(kid)
            code = (mlp[bi] + (nch if ckpt[bi] else 0)) if kind == "mlp" else (attn[bi] if kind == "attn" else 0)
            tk = (kid, self._slot_classes[g], code)     # a stage depends on the slot's class, not its place
            hit = self.single.get(tk)
            if hit is None:
                hit = self.single[tk] = self._stage(kid, g, code)
            kid = hit[0]
            deltas.append(hit[1])
        D = np.array(deltas, dtype=np.int64).reshape(len(deltas), 1, -1)
        return update_chain(L, D, int(pb.m), bool(self.pm_sum)), kids

    def frontier_bound(self, depth: int, *, pq_max: float = float("inf"), thr_q: float = float("inf"),
                       top_k: int = 1, max_labels: int = 20000) -> tuple[float, int]:
        """A lower bound on the time of every plan of this problem that fits pq_max and is faster
        than thr_q: expand the first `depth` decisions exactly (dominance and pruning as in run())
        and take the least (t + bound) over the labels left. Tighter than the bound at the first
        decision, because the decided steps count exactly. Returns (bound_q, nodes); inf when no
        plan can fit or beat thr_q. Stops early (returning the bound so far) past max_labels."""
        stats = DPStats()
        graph = self.graph_for(pq_max, thr_q)
        L, K = self.start()
        M = K.copy()
        depth = min(depth, len(self.positions) - 1)
        for g in range(depth):
            nL, nK, _p, _c, nM = self._expand(g, L, K, thr_q, pq_max, top_k, stats, graph=graph, M=M)
            if len(nL) == 0:
                return float("inf"), stats.nodes
            if len(nL) > max_labels:                    # labels at slot g: bound them there
                return self._open_bound(g, L, K, pq_max, graph, M), stats.nodes
            L, K, M = nL, nK, nM
        return self._open_bound(depth, L, K, pq_max, graph, M), stats.nodes

    def _open_bound(self, g, L, K, pq_max, graph=None, M=None) -> float:
        if len(L) == 0:
            return float("inf")
        lb, mem_lb = self.lower_bounds(g, L, K, pq_max, graph, M)
        ok = mem_lb <= pq_max
        return float(lb[ok].min()) if ok.any() else float("inf")

    def _trace(self, i, history, t_q, peak_q) -> Finished:
        nb = len(self.pb.blocks)
        attn, mlp, ck = [0] * nb, [0] * nb, [False] * nb
        nchoice = len(self.pb.choices)
        for g in range(len(history) - 1, -1, -1):
            parent, code = history[g]
            c = int(code[i])
            kind, bi = self.positions[g]
            if kind == "mlp":
                mlp[bi] = c % nchoice
                ck[bi] = c >= nchoice
            elif kind == "attn":
                attn[bi] = c
            i = int(parent[i])
        return Finished(t_q, peak_q, attn, mlp, ck)

    def _expand(self, g, L, K, thr_q, pq_max, top_k, stats, beam=None, thr_fn=None, memory_only=False,
                deadline=None, graph=None, M=None, front=None):
        """Labels L at slot g (keys K, merged ids M) through its decision: (labels, keys, parent
        rows, codes, merged ids) of those kept, at slot g + 1."""
        m = self.pb.m
        view = None if graph is None else graph.view
        uk, inv = unique_inverse(K)
        arena, trow = self.table_rows(uk, g, deadline, _Timeout)   # new keys cost one stage simulation per decision
        D, NK, CODE = arena.deltas, arena.new_keys[trow], arena.code_rows(len(uk))   # D read at trow, in place
        # Skip (key, decision) pairs that cannot beat thr_q even from the best label of the key
        # (the bound is nondecreasing in t and u).
        tmin, umin = _least_per_key(L, inv, len(uk))
        g2 = g + 1
        last = g2 == len(self.positions)
        if not last:
            # the key terms of the distinct keys the taken entries lead to, once for the entries
            # and their labels (ekeys[einv]: entry i's key)
            rows, cols = np.nonzero(NK >= 0)
            ekeys, einv = unique_inverse(NK[rows, cols])
            KC, KM = self._key_terms(g2, ekeys)
            real_graph = graph is not None and view is None
            krows = graph.rows_of(g2, ekeys) if real_graph else _NO_ROWS
            if np.isfinite(thr_q) or np.isfinite(pq_max):
                best = np.zeros((len(rows), NCOL), dtype=np.int64)
                drows = trow[rows]
                best[:, T] = tmin[rows] + m * D[drows, cols, DT] + D[drows, cols, OPT]
                best[:, U] = umin[rows] + D[drows, cols, S_N]
                # (a merged graph bounds labels by their own merged ids: not per key)
                lb, mem_lb = self._label_bounds(g2, best, einv, KC, KM, pq_max, graph if real_graph else None,
                                                krows[einv] if real_graph else _NO_ROWS, stop_at=thr_q)
                bad = (lb >= thr_q) | (mem_lb > pq_max)
                if front is not None:
                    bad |= (lb >= front.threshold(mem_lb)) | self._front_pruned(
                        g2, front, best, einv, KC, mem_lb, graph if real_graph else None,
                        krows[einv] if real_graph else _NO_ROWS)
                NK[rows[bad], cols[bad]] = -1
            entry_key = np.full(NK.shape, -1, dtype=np.int64)
            entry_key[rows, cols] = einv
        if deadline is not None and time.perf_counter() > deadline:
            raise _Timeout
        C, CK, CP, CC, col = expand(L, inv, D, NK, CODE, m, self.pm_sum, drow=trow)
        CM = view.advance(g, M[CP], col) if view is not None else CK
        stats.nodes += len(C)
        if not last and len(C) and thr_fn is None:
            # bounds, pruning, sort and dominance in compiled code (labelsettle.py): the steps
            # below give the same labels in the same order
            kinv = entry_key[inv[CP], col]
            lrows = krows[kinv] if real_graph else (graph.rows_of(g2, CM) if graph is not None else _NO_ROWS)
            sel, LB, n_memory, n_bound, n_dominated = self._settle(g2, C, CK, kinv, KC, KM, pq_max, graph, lrows,
                                                                    thr_q, memory_only, top_k, deadline)
            stats.pruned_memory += n_memory
            stats.pruned_bound += n_bound
            stats.dominated += n_dominated
            C, CK, CP, CC, CM = C[sel], CK[sel], CP[sel], CC[sel], CM[sel]
            if memory_only:
                C[:, T] = 0
            return self._beam(C, CK, CP, CC, CM, LB, beam, stats)
        if not last and len(C):
            kinv, KC, KM, lgraph, lrows = self._bound_inputs(g2, CK, graph, CM)
            lb, mem_lb = self._label_bounds(g2, C, kinv, KC, KM, pq_max, lgraph, lrows)
            ok_mem = mem_lb <= pq_max
            ok_t = lb < (thr_fn(mem_lb) if thr_fn is not None else thr_q)
            if front is not None:
                ok_t &= ~self._front_pruned(g2, front, C, kinv, KC, mem_lb, lgraph, lrows)
            LB = mem_lb if memory_only else lb
            stats.pruned_memory += int(np.count_nonzero(~ok_mem))
            stats.pruned_bound += int(np.count_nonzero(ok_mem & ~ok_t))
            keep = ok_mem & ok_t
            C, CK, CP, CC, LB, CM = C[keep], CK[keep], CP[keep], CC[keep], LB[keep], CM[keep]
        else:
            if len(C):
                peak = peaks(C)
                keep = (peak <= pq_max) & (C[:, T] < (thr_fn(peak) if thr_fn is not None else thr_q))
                stats.pruned_memory += int(np.count_nonzero(peak > pq_max))
                stats.pruned_bound += int(np.count_nonzero((peak <= pq_max) & (C[:, T] >= thr_q)))
                C, CK, CP, CC, CM = C[keep], CK[keep], CP[keep], CC[keep], CM[keep]
            LB = C[:, U].astype(float) if memory_only else C[:, T].astype(float)
        if memory_only:
            C[:, T] = 0
        if deadline is not None and time.perf_counter() > deadline:
            raise _Timeout
        # dominance within each key
        order = sort_by_key(C, CK)
        C, CK, CP, CC, LB, CM = C[order], CK[order], CP[order], CC[order], LB[order], CM[order]
        keepmask = pareto_by_key(C, CK, top_k, deadline)      # dominance: real futures, real keys
        stats.dominated += int(len(C) - np.count_nonzero(keepmask))
        C, CK, CP, CC, LB, CM = C[keepmask], CK[keepmask], CP[keepmask], CC[keepmask], LB[keepmask], CM[keepmask]
        return self._beam(C, CK, CP, CC, CM, LB, beam, stats)

    def _front_pruned(self, g, front, C, kinv, KC, mem_lb, graph, rows):
        """front.lambda_pruned of labels C at slot g (kinv: their rows of the key terms KC; graph
        not None: read at their rows `rows`), the suffix maxima computed once per front and lambdas."""
        j_lam, _pq, _finite, m_margin, t_margin, H, lams, _Mg, use_graph = self._bound_args(float("inf"), graph, g)
        cache = self._front_sm
        if cache.get("front") is not front:
            cache.clear()
            cache["front"] = front
        sm_r = cache.get("r")
        if sm_r is None:
            sm_r = cache["r"] = front.suffix_max(j_lam)
        sm_g = _NO_H
        if use_graph:
            sm_g = cache.get(id(graph.lams))
            if sm_g is None:
                sm_g = cache[id(graph.lams)] = front.suffix_max(lams)
        step = front.step_of(mem_lb)
        return lambda_pruned(np.ascontiguousarray(C, dtype=np.int64), _int64(step), _int64(kinv),
                             np.asarray(KC, dtype=np.float64), j_lam, sm_r, _int64(rows), H, lams, sm_g, use_graph,
                             m_margin, t_margin)

    @staticmethod
    def _beam(C, CK, CP, CC, CM, LB, beam, stats):
        """The labels a decision keeps: with a beam only that many, least bound LB first."""
        if beam is not None and len(C) > beam:
            best = np.sort(np.argsort(LB, kind="stable")[:beam])
            C, CK, CP, CC, CM = C[best], CK[best], CP[best], CC[best], CM[best]
        stats.kept += len(C)
        return C, CK, CP, CC, CM


def _int64(a: np.ndarray) -> np.ndarray:
    """a as int64, copied only if it is not."""
    return a.astype(np.int64, copy=False)


def _least_per_key(L: np.ndarray, inv: np.ndarray, nkeys: int) -> tuple[np.ndarray, np.ndarray]:
    """The least T and U of the labels of each key (inv: each label's key row)."""
    if len(inv) and np.all(inv[1:] >= inv[:-1]):           # sorted by key, as a decision leaves them
        starts = np.flatnonzero(run_starts(inv))
        return np.minimum.reduceat(L[:, T], starts), np.minimum.reduceat(L[:, U], starts)
    tmin = np.full(nkeys, np.iinfo(np.int64).max)
    umin = np.full(nkeys, np.iinfo(np.int64).max)
    np.minimum.at(tmin, inv, L[:, T])
    np.minimum.at(umin, inv, L[:, U])
    return tmin, umin


def _abandoned(tried: list, pq_max: float, thr_q: float, caps: GraphCaps) -> bool:
    """A graph abandoned at a limit and threshold no smaller, with caps no larger, is not tried
    again: it would meet at least as many keys (a smaller limit or threshold prunes more)."""
    return any(pq_max >= p and thr_q >= t and caps <= c for p, t, c in tried)


def pareto_by_key(C: np.ndarray, CK: np.ndarray, top_k: int, deadline: float | None = None) -> np.ndarray:
    """C sorted by (key, columns...). Keep the rows dominated (<= in every column) by fewer than
    top_k kept rows of the same key; among equal rows the first ones are kept (compiled:
    planner/dominance.py). The deadline is checked between chunks of keys."""
    from osdp_sim.planner.dominance import pareto_segments
    n = len(C)
    keep = np.ones(n, dtype=bool)
    if n <= 1:
        return keep
    starts = np.flatnonzero(run_starts(CK))
    ends = np.append(starts[1:], n)
    C = np.ascontiguousarray(C, dtype=np.int64)
    if n <= PARETO_CHUNK_ROWS:
        bounds = np.array([0, len(starts)])
    else:
        chunk = np.searchsorted(starts, np.arange(0, n, PARETO_CHUNK_ROWS))    # first key of each chunk
        bounds = np.append(np.unique(chunk), len(starts))
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if deadline is not None and time.perf_counter() > deadline:
            raise _Timeout
        pareto_segments(C, starts[lo:hi], ends[lo:hi], top_k, keep)
    return keep
