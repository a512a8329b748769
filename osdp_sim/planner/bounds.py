"""Admissible bounds for the part of a plan not yet decided.

The search decides groups in backward order (last block first). A partial plan (label) holds the
exact time t of everything decided, and U, the largest live-byte value of its events measured
against the (Res + kept) bytes of the undecided steps (costmodel/fast.py). Two bounds prune it;
tests/test_search_bounds.py checks both along random plans (bound <= true value at every point).

Memory. Every later stage adds its steps' resident + kept bytes S >= 0 to every event already in
U (fast.apply: U' >= U + S_N), so the final live-byte peak is at least U + the sum over the
undecided groups of the least S among their choices: resident states + all saved activations at
the start of backward, built up exactly for what is decided.

Time. What remains is the forward segments of the undecided steps and the backward from the
pending step on: disjoint stretches of the timeline.
  * Forward: a segment starts compute c and a gather a together; seg(c, a) = c + a - k min(c, a)
    with k = 2 - s for overlap slowdown s <= 2 (k = 0 bounds it for s > 2). Segments between
    steps of one group are exact per choice; the one joining a group's last step to the next
    group's first gather is linearised: as min(c, a) <= mu c + (1 - mu) a for mu in [0, 1],
    seg(c, a) >= (1 - k mu) c + (1 - k (1 - mu)) a, which splits between the two groups.
  * Backward: a stretch in which compute does C and communication A lasts at least
    C + A - k min(C, A) (time = compute alone + comm alone + both; both run at 1/s while
    overlapped). The same linearisation (mu_b) makes the pooled work additive.
  * Some work provably runs with the other stream idle and counts in full, outside the pool:
    - the root's all-gather at t = 0; the root's reduction (issued after the last compute task)
      and the optimizer (after the last reduction);
    - a checkpointed block that gathers some unit again for backward (ZeRO-3, ddp, any split):
      its recompute waits for the last of those gathers, which are queued behind the reduction
      of the step before (the first step of the next block in forward order), which in turn waits
      for that step's backward to end; so compute idles through that reduction and the gathers
      (unless that step is the head, which has no reduction: then the gathers overlap the head's
      backward and only what follows is exposed). When the recompute starts the queue is empty
      and nothing is appended until the block's last step's backward ends: the recompute and
      that backward run alone.
    The reduction exposed belongs to the next block's first group, so the bound is a chain over
    blocks with a two-state flag (is the block below checkpointed with a re-gather?).
So T_rest >= per-group linear terms + key constants (the pending step's backward and
reductions, the queued work, its own forward gather) for every (mu_f, mu_b).

Memory-aware time bound (Lagrangian). With the remaining budget beta = limit - U, a feasible
completion has sum S <= beta, so for every lambda >= 0
  T_rest >= min over completions [sum (tau + lambda S)] - lambda beta,
computed by the same chain. Every lambda gives a valid bound; the search takes the largest over a
grid: 0 and the slopes of the lower convex hull of the blocks' (S, tau) points (the breakpoints of
the dual function, where its maximum lies when every block has the same shape).
"""

import numpy as np

from osdp_sim.costmodel.fast import MEM_Q, TIME_Q, Pending
from osdp_sim.jit import compiled
from osdp_sim.planner.problem import Option, Problem

MU = (0.0, 0.5, 1.0)


def _hull_slopes(S: np.ndarray, T: np.ndarray) -> list[float]:
    """-dT/dS along the lower-left convex hull of the points (S, T)."""
    return _hull_slopes_sorted(np.ascontiguousarray(S, dtype=np.float64), np.ascontiguousarray(T, dtype=np.float64),
                               np.argsort(S, kind="stable")).tolist()


@compiled
def _hull_slopes_sorted(S, T, order):
    """order sorts S up. Of each run of equal S only its least T can be undominated; a point is
    kept when its T is below every T before it. A monotone chain over the kept points (x up, y
    down) leaves the lower hull, whose falling edges give the slopes."""
    n = len(S)
    hx = np.empty(n)
    hy = np.empty(n)
    h = 0
    best_t = np.inf
    i = 0
    while i < n:
        x = S[order[i]]
        y = T[order[i]]
        j = i + 1
        while j < n and S[order[j]] == x:
            y = min(y, T[order[j]])
            j += 1
        i = j
        if not y < best_t:
            continue
        best_t = y
        while h >= 2 and (hx[h - 1] - hx[h - 2]) * (y - hy[h - 2]) - (hy[h - 1] - hy[h - 2]) * (x - hx[h - 2]) <= 0:
            h -= 1
        hx[h] = x
        hy[h] = y
        h += 1
    out = np.empty(max(h - 1, 0))
    k = 0
    for i in range(h - 1):
        if hx[i + 1] > hx[i] and hy[i] > hy[i + 1]:
            out[k] = (hy[i] - hy[i + 1]) / (hx[i + 1] - hx[i])
            k += 1
    return out[:k]


class ShapeTerms:
    """Per choice of one group shape, fixed-point time units, one row per (mu_f, mu_b)."""

    def __init__(self, opts: list[Option], kind: str, m: int, w: tuple):
        wf_c, wf_a, wb_c, wb_a = (x[:, None] for x in w)
        a = lambda f: np.array([f(o) for o in opts])          # noqa: E731
        # cf: the recompute of a checkpointed block (Option.rc: all of the forward unless
        # selective), the only use of the forward work here
        cf, cb, ab, agz, opt = a(lambda o: o.rc), a(lambda o: o.cb), a(lambda o: o.ab), \
            a(lambda o: o.agz), a(lambda o: o.opt)
        fin, fl, af = a(lambda o: o.fwd_in), a(lambda o: o.f_last), a(lambda o: o.a_first)
        bl = a(lambda o: o.b_last) if kind == "mlp" else np.zeros(len(opts))
        tq = 1.0 / TIME_Q
        base = m * (fin + wf_c * fl + wf_a * af + wb_c * cb + wb_a * ab) + opt
        self.nc = base * tq
        self.ck = (base + m * wb_c * cf) * tq                         # recompute pooled
        # recompute and the last backward alone (their pooled share raised to weight 1)
        alone = m * (cf + (1 - wb_c) * bl)
        self.ckh = (base + alone) * tq                                 # pending step = head
        self.cke = (base + alone + m * (1 - wb_a) * agz) * tq          # gathers exposed too
        self.s_nc = a(lambda o: o.res + o.kept_act + o.kept_gath) / MEM_Q
        self.s_ck = a(lambda o: o.res + o.kept_gath + o.kept_sac) / MEM_Q
        self.z3 = a(lambda o: o.z3).astype(bool)
        # the first step's reduction exposed when the block below is checkpointed with a re-gather
        self.ex = m * (1 - wb_a) * a(lambda o: o.r_first) * tq


class Bounds:
    """Bound tables for one problem, per slot g: the labels there wait for decision positions[g]
    (dp.positions_of)."""

    def __init__(self, pb: Problem, positions: list[tuple[str, int]]):
        self.pb = pb
        self.positions = positions
        m, s = pb.m, pb.s
        k = max(0.0, 2.0 - s)
        self.mus = [(mf, mb) for mf in MU for mb in MU]
        self.w = tuple(np.array(v) for v in (
            [1 - k * mf for mf, _ in self.mus], [1 - k * (1 - mf) for mf, _ in self.mus],
            [1 - k * mb for _, mb in self.mus], [1 - k * (1 - mb) for _, mb in self.mus]))
        self.terms = [ShapeTerms(opts, kind, m, self.w) for opts, kind in zip(pb.shapes, pb.shape_kinds)]
        allow_nc, allow_ck = False in pb.ckpt_options, True in pb.ckpt_options
        last = len(pb.blocks) - 1
        wf_c, wf_a, wb_c, wb_a = self.w
        e = pb.root.embed
        embed_tau = m * ((e.forward_gather_s or 0.0) + wf_c * e.fwd_s + wb_c * e.bwd_s + sum(w for (w, *_r) in e.reduction_items)) / TIME_Q
        self.embed_s = (e.act_bytes + e.gathered_bytes) / MEM_Q
        sigs: dict = {}
        for b in pb.blocks:
            sigs.setdefault((b.sig, b.index == last), b)
        # lambda grid: 0 and the hull slopes of every block signature, per mu
        lam_sets = [{0.0} for _ in self.mus]
        for (sig, is_last), b in sigs.items():
            ta, tm = self.terms[b.attn_shape], self.terms[b.mlp_shape]
            ck = b.ck / MEM_Q
            for i in range(len(self.mus)):
                Ss, Ts = [], []
                if allow_nc:
                    Ss.append((ta.s_nc[:, None] + tm.s_nc[None, :]).ravel())
                    Ts.append((ta.nc[i][:, None] + tm.nc[i][None, :]).ravel())
                if allow_ck:
                    z = ta.z3[:, None] | tm.z3[None, :]
                    Ss.append((ta.s_ck[:, None] + tm.s_ck[None, :]).ravel() + ck)
                    Ts.append(np.where(z, ta.cke[i][:, None] + tm.cke[i][None, :],
                                       ta.ck[i][:, None] + tm.ck[i][None, :]).ravel())
                lam_sets[i].update(_hull_slopes(np.concatenate(Ss), np.concatenate(Ts)))
        self.j_mu = np.concatenate([np.full(len(ls), i) for i, ls in enumerate(lam_sets)])
        self.j_lam = np.concatenate([np.array(sorted(ls)) for ls in lam_sets])
        J = len(self.j_lam)
        mu_of, lam = self.j_mu, self.j_lam
        inf = np.full(J, np.inf)

        def gmin(tau, S, mask=None, extra=None):      # per j: min over choices of tau + lambda S
            v = tau[mu_of] + lam[:, None] * S[None, :]
            if extra is not None:
                v = v + extra[mu_of] if extra.ndim == 2 else v + extra[None, :]
            if mask is not None:
                if not mask.any():
                    return inf
                v = v[:, mask]
            return np.min(v, axis=1)

        # Per block signature and flag of the block below (sp): the attention's contribution in
        # each mode, and the block's value given its own flag (sb) and sp.
        attn_tab, val, mem_blk, mem_a_nc, mem_a_ck = {}, {}, {}, {}, {}
        for (sig, is_last), b in sigs.items():
            ta, tm = self.terms[b.attn_shape], self.terms[b.mlp_shape]
            ta_e = ta.ckh if is_last else ta.cke
            tm_e = tm.ckh if is_last else tm.cke
            ck = lam * (b.ck / MEM_Q)
            vv = {}
            for sp in (0, 1):
                ex = ta.ex if sp else np.zeros_like(ta.ex)
                a_nc = gmin(ta.nc, ta.s_nc, extra=ex) if allow_nc else inf
                a_e_all = gmin(ta_e, ta.s_ck, extra=ex) + ck
                a_e_z = gmin(ta_e, ta.s_ck, ta.z3, extra=ex) + ck
                a_ck_n = gmin(ta.ck, ta.s_ck, ~ta.z3, extra=ex) + ck
                attn_tab[sig, is_last, sp] = {"u": a_nc, "dz": a_e_all, "dn_z": a_e_z, "dn_n": a_ck_n}
                v0, v1 = [], []
                if allow_nc:
                    v0.append(a_nc + gmin(tm.nc, tm.s_nc))
                if allow_ck:
                    v1.append(np.minimum(a_e_all + gmin(tm_e, tm.s_ck, tm.z3), a_e_z + gmin(tm_e, tm.s_ck)))
                    v0.append(a_ck_n + gmin(tm.ck, tm.s_ck, ~tm.z3))
                vv[0, sp] = np.minimum.reduce(v0) if v0 else inf
                vv[1, sp] = np.minimum.reduce(v1) if v1 else inf
            val[sig, is_last] = vv
            mems = ([ta.s_nc.min() + tm.s_nc.min()] if allow_nc else []) + \
                   ([ta.s_ck.min() + tm.s_ck.min() + b.ck / MEM_Q] if allow_ck else [])
            mem_blk[sig, is_last] = min(mems)
            mem_a_nc[sig, is_last] = ta.s_nc.min()
            mem_a_ck[sig, is_last] = ta.s_ck.min() + b.ck / MEM_Q
        # Slot tables, from the embedding up. acc[f] = least value of everything below, given
        # that the lowest decided block above it has flag f... i.e. acc[f] is indexed by the flag
        # of the last block added (the one just below the slot).
        n = len(positions)
        self.tab: dict = {}
        self.mem = np.zeros(n + 1)
        self.memd = np.zeros(n + 1)
        acc = (embed_tau[mu_of] + lam * self.embed_s, inf)
        accm = self.embed_s
        for g in range(n - 1, -1, -1):
            kind, bi = positions[g]
            if kind == "embed":
                self.tab[g] = {"A": acc[0], "B": inf}
                self.mem[g] = accm
                continue
            b = pb.blocks[bi]
            key = (b.sig, bi == last)
            if kind == "attn":
                t0, t1 = attn_tab[key + (0,)], attn_tab[key + (1,)]

                def below(name):
                    return np.minimum(t0[name] + acc[0], t1[name] + acc[1])
                self.tab[g] = {"u": below("u"), "dz": below("dz"), "dn_z": below("dn_z"), "dn_n": below("dn_n")}
                self.mem[g] = accm + mem_a_nc[key]
                self.memd[g] = accm + mem_a_ck[key]
                vv = val[key]
                acc = (np.minimum(vv[0, 0] + acc[0], vv[0, 1] + acc[1]),
                       np.minimum(vv[1, 0] + acc[0], vv[1, 1] + acc[1]))
                accm = accm + mem_blk[key]
            else:
                self.tab[g] = {"A": acc[0], "B": acc[1]}
                self.mem[g] = accm
        # fixed-point rounding: each stage's sums are rounded to whole units
        self.t_margin = 4.0 * (n + 2) * (m + 1) + 16.0
        self.m_margin = 8.0 * (n + 2) + 16.0
        self._slot_arrays()

    # ---- key-dependent parts ------------------------------------------------------------------
    def _slot_arrays(self) -> None:
        """The slot tables as arrays for _key_terms_loop: per slot, its kind (SLOT_*) and the rows
        TAB_* (inf where a slot has none)."""
        n, J = len(self.positions), len(self.j_lam)
        self.slot_kind = np.full(n, SLOT_OTHER, dtype=np.int64)
        self.slot_tab = np.full((n, len(TAB_NAMES), J), np.inf)
        for g in range(n):
            tab = self.tab[g]
            for r, name in enumerate(TAB_NAMES):
                if name in tab:
                    self.slot_tab[g, r] = tab[name]
            self.slot_kind[g] = {"mlp": SLOT_MLP, "attn": SLOT_ATTN}.get(self.positions[g][0], SLOT_OTHER)

    def key_terms(self, g: int, R: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """For labels at slot g (waiting for decision positions[g]) whose keys are summarised by
        the rows R (key_row): ((N, J) time units of everything undecided, before subtracting
        lambda * budget; (N,) memory lower bound of the undecided)."""
        n = len(R)
        if g >= len(self.positions):
            return np.zeros((n, len(self.j_lam))), np.zeros(n)
        kind, bi = self.positions[g]
        # a deferred MLP choice is read at its block's attention slot; no such key reaches the embedding
        terms = self.terms[self.pb.blocks[bi].mlp_shape] if kind != "embed" else self.terms[0]
        wf_c, wf_a, wb_c, wb_a = self.w
        return _key_terms_loop(np.ascontiguousarray(R, dtype=np.float64), float(self.pb.m), self.j_mu, self.j_lam,
                               wf_a, wb_c, wb_a, self.slot_tab[g], int(self.slot_kind[g]), float(self.mem[g]),
                               float(self.memd[g]), terms.ck, terms.ckh, terms.cke, terms.s_ck, terms.z3)


# Bounds.slot_tab's rows (Bounds.tab's names): "A" / "B" (mlp and embedding slots: the least value
# below, given the flag of the block below); at an attention slot "u" (its block not checkpointed),
# "dz" (checkpointed, its MLP re-gathers), "dn_z" / "dn_n" (the deferred MLP choice's two cases)
TAB_NAMES = ("A", "B", "u", "dz", "dn_z", "dn_n")
TAB_A, TAB_B, TAB_U, TAB_DZ, TAB_DN_Z, TAB_DN_N = range(len(TAB_NAMES))
SLOT_MLP, SLOT_ATTN, SLOT_OTHER = 0, 1, 2      # Bounds.slot_kind: mlp, attention, the embedding


@compiled
def _key_terms_loop(R, m, mu, lam, wf_a, wb_c, wb_a, tab, slot_kind, mem, memd, ck, ckh, cke, s_ck, z3):
    """Bounds.key_terms at one slot (tab = slot_tab[g]); the terms of a deferred MLP choice are
    those of the slot's block (ShapeTerms ck, ckh, cke, s_ck, z3)."""
    n, J = R.shape[0], len(mu)
    T = np.empty((n, J))
    M = np.empty(n)
    for r in range(n):
        kind = int(R[r, 0])
        b, items, qwork, agf, head = R[r, 1], R[r, 2], R[r, 3], R[r, 4], R[r, 5]
        cd = int(R[r, 6])
        for j in range(J):
            i = mu[j]
            kc = m * (wb_c[i] * b + wb_a[i] * (items + qwork) + wf_a[i] * agf) / TIME_Q
            if kind == KEY_PLAIN:
                if slot_kind == SLOT_MLP:
                    expo_p = m * (1 - wb_a[i]) * items / TIME_Q      # the pending reduction exposed
                    T[r, j] = kc + min(tab[TAB_A, j], tab[TAB_B, j] + expo_p)
                elif slot_kind == SLOT_ATTN:
                    T[r, j] = kc + tab[TAB_U, j]
                else:
                    T[r, j] = kc + tab[TAB_A, j]
            elif kind == KEY_CKMLP_DONE:        # the MLP of this checkpointed block re-gathers: sigma = 1
                T[r, j] = kc + tab[TAB_DZ, j]
            else:                                # the checkpointed MLP choice cd, recorded in the key
                expo_p = m * (1 - wb_a[i]) * items / TIME_Q
                own = ck[i, cd] + lam[j] * s_ck[cd]
                up = (ckh[i, cd] if head > 0 else cke[i, cd]) - ck[i, cd]
                if z3[cd]:
                    T[r, j] = kc + own + up + expo_p + tab[TAB_DZ, j]
                else:
                    T[r, j] = kc + own + min(tab[TAB_DN_Z, j] + up + expo_p, tab[TAB_DN_N, j])
        if kind == KEY_PLAIN:
            M[r] = mem
        elif kind == KEY_CKMLP_DONE:
            M[r] = memd
        else:
            M[r] = memd + s_ck[cd]
    return T, M


KEY_COLS = 7
KEY_PLAIN, KEY_CKMLP_DONE, KEY_DEFERRED = 0, 1, 2      # key_row's kind (keystore.py's key types)


def key_row(kind: int, pend: Pending | None, queue: tuple, c: int = -1) -> tuple:
    """What the bounds read of a key: (kind: KEY_PLAIN, KEY_CKMLP_DONE (keystore.CkMlpDone) or
    KEY_DEFERRED (keystore.DeferredMlp); the pending backward's work; its reductions' work; the
    queued work; its own forward gather; 1 if it has no reductions (the head); the deferred
    choice)."""
    if pend is None:
        return (kind, 0.0, 0.0, 0.0, 0.0, 1.0, c)
    return (kind, pend.bwd_s, sum(w for (w, *_r) in pend.end_items), sum(q[0] for q in queue), pend.forward_gather_s or 0.0,
            0.0 if pend.end_items else 1.0, c)
