"""Distinct plans: what the decisions campaign and the tune count as different plans, and the
search's N best of them.

"Distinct" (plan_signature): plans differing only by which of several identical blocks carries
which choice (a permutation of blocks) are one plan; two plans are distinct when they differ in
micro-batch, accumulation, shard group, the root's (or another non-block group's) choice, or the
multiset of per-block (choices, checkpointed) tuples: the number of checkpointed blocks or the
count of blocks with each strategy mix.
"""

import json
import re
import time
from collections import Counter

from osdp_sim.plan import Plan, plan_to_dict

_BLOCK = re.compile(r"block(\d+)\.(.+)")


def plan_key(plan: Plan) -> str:
    """Identity of a plan: its JSON form (two plans with one key are the same run)."""
    return json.dumps(plan_to_dict(plan), sort_keys=True)


def plan_signature(plan: Plan) -> tuple:
    """Equal for plans that differ only by a permutation of blocks (module docstring)."""
    blocks: dict[int, list] = {}
    other = []
    for k, ch in sorted(plan.choices.items()):
        m = _BLOCK.fullmatch(k)
        if m:
            blocks.setdefault(int(m.group(1)), []).append((m.group(2), ch.label()))
        else:
            other.append((k, ch.label()))
    per_block = Counter((tuple(sorted(blocks.get(i, []))), bool(ck)) for i, ck in enumerate(plan.checkpoint))
    return (plan.micro_batch, plan.grad_accum, plan.shard_size, plan.precision, plan.optimizer,
            tuple(other), tuple(sorted(per_block.items())))


def describe(plan: Plan) -> str:
    """Short text: micro-batch, checkpointed blocks, the strategy counts of each kind of block group
    (attn, mlp, ...), the root's choice."""
    n = len(plan.checkpoint)
    kinds: dict[str, Counter] = {}
    other = []
    for k, ch in sorted(plan.choices.items()):
        m = _BLOCK.fullmatch(k)
        if m:
            kinds.setdefault(m.group(2), Counter())[ch.label()] += 1
        else:
            other.append(f"{k} {ch.label()}")
    parts = [f"{kind} " + " ".join(f"{v}x {s}" if len(c) > 1 else s for s, v in c.most_common())
             for kind, c in kinds.items()]
    return ", ".join([f"mb {plan.micro_batch}" + (f" x{plan.grad_accum}" if plan.grad_accum > 1 else ""),
                      f"ckpt {sum(plan.checkpoint)}/{n}"] + parts + other)


def top_distinct(spec, hw, limit_bytes: float, space, n: int, *, time_limit_s: float | None = 30.0,
                 max_k: int = 640):
    """The search's N best distinct plans (by plan_signature), best first, with their estimates:
    the top-k search with k raised (x4) until N distinct ones are among them, the space has no
    more, k reaches max_k or the time is up. Returns (search pick result, [(plan, estimate)])."""
    from osdp_sim.planner.bnb import search
    t0 = time.monotonic()
    k = max(8, 4 * n)
    while True:
        left = None if time_limit_s is None else max(1.0, time_limit_s - (time.monotonic() - t0))
        res = search(spec, hw, limit_bytes, space, top_k=k, time_limit_s=left)
        seen, out = set(), []
        for t in res.top:
            plan, est = t.plan, t.prediction
            sig = plan_signature(plan)
            if sig not in seen:
                seen.add(sig)
                out.append((plan, est))
        spent = time.monotonic() - t0
        if (len(out) >= n or len(res.top) < k or k >= max_k
                or (time_limit_s is not None and spent > time_limit_s / 2)):
            return res, out[:n]
        k *= 4
