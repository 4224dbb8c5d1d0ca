"""Built-in rules, each written once for Torch-IR and Aten-IR.

Importing this package registers them. One module per family; each rule is a function
named after the rewrite it performs, with a docstring showing before -> after.
"""

from . import canonical, horizontal, inverse, pointwise, slices, split_cat, unbind_stack, views  # noqa: F401
from ..inductor_ir import rules as _inductor_ir_rules  # noqa: F401
