"""What a label of pareto_front's search must beat: the plans found so far as a staircase, and
the test that prunes a label whose every completion one of them dominates (docs/search.md,
"Other entry points").

A completion of a label (t, U) that ends at peak P (a label peak, MEM_Q) takes at least
t + c_j - lambda_j (P - U) for every term j of the label's Lagrangian time bound (the relaxed
bound's key terms and the key graph's H, each with its lambda >= 0: bounds.py, keygraph.py), since
its stages add at most P - U bytes of S. The front found so far beats time tau_i from peak p_i on
(a staircase). So the completion cannot lead to a new front point when, for one j, that line lies
at or above the staircase over every P the completion may end at ([the label's memory bound, the
limit]): on step i the line is least and the step's time reached at the step's upper end, hence
the test t + c_j + lambda_j U >= max over the steps i from the memory bound's on of
(tau_i + lambda_j min(p_(i+1), limit)), a suffix maximum per lambda computed once per front."""

from dataclasses import dataclass

import numpy as np

from osdp_sim.costmodel.fast import MEM_Q, TIME_Q
from osdp_sim.jit import compiled
from osdp_sim.planner.labels import T, U

# A step's upper end in label units, rounded up by this much more than the conversion's error:
# the test then never prunes a completion that ends just below a front point's peak.
_UPPER_END_SLACK = 1e-9


@dataclass(frozen=True)
class FrontStairs:
    """The front found so far, as the thresholds a label of one configuration must beat."""

    peak_bytes: np.ndarray        # (n,) ascending: the estimate() peak of each plan found
    time_q: np.ndarray            # (n,) nonincreasing: the least time (TIME_Q) among plans of peak <= peak_bytes[i]
    upper_q: np.ndarray           # (n,) step i's upper end as a label peak (MEM_Q), rounded up; the limit last
    fragmentation: float          # HardwareProfile.memory.fragmentation: label peak -> estimate() peak
    context_bytes: float          # HardwareProfile.memory.context_bytes

    @classmethod
    def of(cls, peak_bytes: np.ndarray, best_sps: np.ndarray, samples: float, pq_max: float,
           fragmentation: float, context_bytes: float) -> "FrontStairs":
        """peak_bytes ascending and best_sps (the best samples/s at a peak up to each) of the plans
        found; samples per iteration of the configuration searched; pq_max its limit (MEM_Q)."""
        peak_bytes = np.asarray(peak_bytes, dtype=float)
        best_sps = np.asarray(best_sps, dtype=float)
        with np.errstate(divide="ignore"):
            time_q = np.where(best_sps > 0, samples / np.where(best_sps > 0, best_sps, 1.0) / TIME_Q, np.inf)
        nxt = (peak_bytes[1:] - context_bytes) / ((1.0 + fragmentation) * MEM_Q)
        upper = np.minimum(np.append(nxt * (1.0 + _UPPER_END_SLACK) + 1.0, np.inf), float(pq_max))
        return cls(peak_bytes, time_q, upper, float(fragmentation), float(context_bytes))

    def step_of(self, peak_q: np.ndarray) -> np.ndarray:
        """The step each label peak (MEM_Q) lies on: the last plan found of no larger estimate()
        peak, -1 where there is none."""
        p = np.maximum(np.asarray(peak_q, dtype=float), 0.0) * MEM_Q
        return np.searchsorted(self.peak_bytes, p + p * self.fragmentation + self.context_bytes, side="right") - 1

    def threshold(self, peak_q: np.ndarray) -> np.ndarray:
        """The time (TIME_Q) a label of peak (or memory bound) peak_q must beat: inf where no plan
        found has a peak that small."""
        i = self.step_of(peak_q)
        return np.where(i >= 0, self.time_q[np.maximum(i, 0)], np.inf) if len(self.time_q) else \
            np.full(len(i), np.inf)

    def suffix_max(self, lams: np.ndarray) -> np.ndarray:
        """(n, J): [i, j] = max over steps i' >= i of time_q[i'] + lams[j] * upper_q[i'] (lams[j] = 0:
        the step's time alone, also where the upper end is unbounded)."""
        lams = np.asarray(lams, dtype=float)
        if len(self.time_q) == 0 or len(lams) == 0:
            return np.zeros((len(self.time_q), len(lams)))
        with np.errstate(invalid="ignore"):
            v = self.time_q[:, None] + np.where(lams[None, :] > 0, lams[None, :] * self.upper_q[:, None], 0.0)
        return np.maximum.accumulate(v[::-1], axis=0)[::-1].copy()


@compiled
def lambda_pruned(C, step, kinv, KC, j_lam, SM_r, rows, H, lams, SM_g, use_graph, m_margin, t_margin):
    """[i]: label i (step[i] its memory bound's step, -1 none) is pruned by one line of its time
    bound: t + c_j + lambda_j (U - m_margin) - t_margin >= SM[step, j], c_j a relaxed key term
    KC[kinv[i], j] (lambda j_lam[j], SM_r) or a graph term H[rows[i], j] (lams[j], SM_g)."""
    n = C.shape[0]
    out = np.zeros(n, dtype=np.bool_)
    for i in range(n):
        s = step[i]
        if s < 0:
            continue
        t = float(C[i, T]) - t_margin
        u = float(C[i, U]) - m_margin
        k = kinv[i]
        done = False
        if use_graph:
            r = rows[i]
            for j in range(lams.shape[0]):
                if t + H[r, j] + lams[j] * u >= SM_g[s, j]:
                    done = True
                    break
        if not done:
            for j in range(j_lam.shape[0]):
                if t + KC[k, j] + j_lam[j] * u >= SM_r[s, j]:
                    done = True
                    break
        out[i] = done
    return out
