"""Scale: G members ``y_g = x_g * s_g`` (one scalar per member) in one launch: the smallest kernel
family, the template docs/writing-a-kernel.md copies (tests/kernels/test_family_template.py
builds it into a copy of the kernels package and runs it).

kernel.py     the Triton kernel and its host side (imported on the first launch)
reference.py  plain torch: the CPU / no-Triton path and the tests' oracle
op.py         ``torch.ops.optimus.toy_scale``: schema, checks, implementation, fake, autograd
api.py        the public function: which path a call takes
"""

from .api import scale

__all__ = ["scale"]
