"""How many aten ops a call dispatches: the eager op counts the cost model's host terms use
(costmodel/kernels.py HOST_OPS, lowering.py OPTIMIZER_OPS_PER_TENSOR)."""

from torch.utils._python_dispatch import TorchDispatchMode


class OpCounter(TorchDispatchMode):
    """Inside `with OpCounter() as c:`, every aten op dispatched adds one to `c.ops`."""

    def __init__(self):
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))
