"""Real execution of plans with torch.distributed (needs the `runtime` extra: torch).

`osdp_sim.runtime.apply_plan(model, plan, layout=...)` applies a plan to any torch model
(osdp_sim/runtime/apply.py); imported lazily so that importing this package needs no torch.
"""

_LAZY = {"apply_plan": "apply", "AppliedPlan": "apply", "GroupApplied": "apply",
         "resolve_layout": "apply", "make_optimizer": "parallelize"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(f"osdp_sim.runtime.{_LAZY[name]}"), name)
    raise AttributeError(f"module 'osdp_sim.runtime' has no attribute {name!r}")


__all__ = sorted(_LAZY)
