"""KeyStore.intern_new_keys (grouped by a compiled hash of the queues) gives the ids that
intern_new_keys_each (one entry at a time, its reference) gives, in the same order, on the
table rows of real searches; a hash shared by different queues falls back to the reference."""

import numpy as np
import pytest

import osdp_sim.planner.keystore as keystore
from osdp_sim.hardware.load import load_profile
from osdp_sim.model.config import with_overrides
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.spec import build_spec
from osdp_sim.planner.bnb import search
from osdp_sim.planner.space import SearchSpace

SPACE = SearchSpace(splits=(1, 2, 4), micro_batches=(1, 2, 4))


def _run(spec, hw, limit_bytes):
    """The search's result and its key store (every key, in id order)."""
    cache: dict = {}
    res = search(spec, hw, limit_bytes, SPACE, time_limit_s=None, cache=cache)
    return res, cache["keys"].keys


def _digest(res) -> tuple:
    return (res.status, res.nodes, res.best_bound_samples_per_s, res.prediction.samples_per_s,
            res.plan.choices, res.plan.checkpoint)


@pytest.mark.parametrize("hashes", ["compiled", "all equal", "four values"])
def test_grouped_interning_gives_the_reference_ids(monkeypatch, hashes):
    spec = build_spec(with_overrides(BUILTIN["gpt2-124m"], n_layers=4))
    hw = load_profile("titan8")
    limit = 1.2 * 2**30
    calls = {"grouped": 0, "each": 0}
    grouped, each = keystore.KeyStore.intern_new_keys, keystore.KeyStore.intern_new_keys_each

    def counted_grouped(self, *a):
        calls["grouped"] += 1
        return grouped(self, *a)

    def counted_each(self, *a):
        calls["each"] += 1
        return each(self, *a)

    monkeypatch.setattr(keystore.KeyStore, "intern_new_keys_each", counted_each)
    monkeypatch.setattr(keystore.KeyStore, "intern_new_keys", counted_grouped)
    if hashes != "compiled":
        real = keystore._queue_hashes
        width = 1 if hashes == "all equal" else 4
        monkeypatch.setattr(keystore, "_queue_hashes", lambda *a: real(*a) % np.uint64(width))
    res, keys = _run(spec, hw, limit)
    assert calls["grouped"] > 10
    if hashes == "compiled":
        assert calls["each"] == 0                # no collision on a real search
    else:
        assert calls["each"] > 0                 # the collisions were caught
    # the reference: one entry at a time
    monkeypatch.setattr(keystore.KeyStore, "intern_new_keys", each)
    ref, ref_keys = _run(spec, hw, limit)
    assert keys == ref_keys and len(keys) > 100
    kinds = {type(k).__name__ for k in keys}
    assert {"CkMlpDone", "DeferredMlp", "tuple"} <= kinds          # every kind of entry was interned
    assert _digest(res) == _digest(ref)
