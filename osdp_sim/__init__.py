"""osdp-sim: a simulator-first cost-modelling toolkit for sharded data-parallel training.

Flow: model -> hardware -> plan -> costmodel -> planner (search) -> runtime -> records ->
calibrate -> viz. Each stage imports only from the stages before it.

The Python API (osdp_sim/api.py, docs/python-api.md): osdp_sim.load_model, load_profile,
uniform_plan, estimate, search, pareto, sweep. They are imported on first use, so `import osdp_sim`
stays cheap and never imports torch.
"""

__version__ = "0.1.0"

API = ("load_model", "load_profile", "uniform_plan", "estimate", "search", "pareto", "sweep")
__all__ = list(API)


def __getattr__(name: str):
    if name in API:
        from osdp_sim import api
        return getattr(api, name)
    raise AttributeError(f"module 'osdp_sim' has no attribute {name!r}")
