from osdp_sim.plan.io import load_plan, plan_from_dict, plan_to_dict, save_plan, write_json_atomic
from osdp_sim.plan.plan import (OPTIMIZERS, PRECISIONS, SPLITS, STRATEGIES, GroupChoice, Plan,
                                uniform_plan)

__all__ = ["load_plan", "plan_from_dict", "plan_to_dict", "save_plan", "write_json_atomic",
           "OPTIMIZERS", "PRECISIONS", "SPLITS", "STRATEGIES", "GroupChoice", "Plan", "uniform_plan"]
