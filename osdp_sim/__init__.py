"""osdp-sim: a simulator-first cost-modelling toolkit for sharded data-parallel training.

Flow: model -> hardware -> plan -> costmodel -> search -> runtime -> records -> calibrate -> viz.
Each stage imports only from the stages before it.
"""

__version__ = "0.1.0"
