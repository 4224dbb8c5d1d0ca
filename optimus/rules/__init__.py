"""Built-in rules of every level, in one registry and one form.

Importing this package registers them (``optimus/__init__.py`` does). One module per
family; each rule is a function named after the rewrite it performs, with a docstring
showing before -> after. The FX rules run at Torch-IR and Aten-IR (written once, against
the canonical vocabulary); ``kernel_fusion`` holds the Inductor-IR rules.
"""

from . import canonical, casts, embedding, grouped_kernels, horizontal, inverse, pointwise, slices, split_cat, unbind_stack, views  # noqa: F401
from . import kernel_fusion  # noqa: F401  (Inductor-IR; after the FX families, as registered before)
