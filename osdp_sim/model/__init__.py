from osdp_sim.model.config import ModelConfig
from osdp_sim.model.families import BUILTIN
from osdp_sim.model.load import config_from_dict, load_model, load_model_config
from osdp_sim.model.spec import Activations, LinearShape, ModelSpec, OpGroup, Unit, build_spec

__all__ = ["ModelConfig", "BUILTIN", "load_model", "load_model_config", "config_from_dict",
           "Activations", "LinearShape", "ModelSpec", "OpGroup", "Unit", "build_spec"]


def __getattr__(name):
    # describe_module needs torch: imported on first use, so the core loads without it.
    if name == "describe_module":
        from osdp_sim.model.describe import describe_module
        return describe_module
    raise AttributeError(f"module 'osdp_sim.model' has no attribute {name!r}")
