"""Built-in rules of every level, in one registry and one form.

Importing this package registers them (``optimus/__init__.py`` does). One module per
family; each rule is a function named after the rewrite it performs, with a docstring
showing before -> after. The FX rules run at Torch-IR and Aten-IR (written once, against
the canonical vocabulary); ``kernel_fusion`` holds the Inductor-IR rules.

The families are imported in the order of ``FAMILIES``: within a stage
(``core.registry.STAGES``) rules run in the order they were registered, so this list and
the order of the rules in each module are the whole of their order. Where two families
meet at one anchor op, the earlier one's rules are tried first: ``inverse`` (an op undoing
a cat) before ``slices`` (ranges of ranges), ``views`` (view chains) before ``split_cat``
and ``unbind_stack`` (parts put back together); the horizontal rules that stack
(``horizontal``) before the ones that emit a grouped kernel for what they decline
(``grouped_kernels``).
"""

from . import canonical, inverse, slices, views, split_cat, unbind_stack, pointwise, casts  # noqa: F401  (FX, vertical)
from . import embedding, horizontal, grouped_kernels  # noqa: F401  (FX, horizontal)
from . import kernel_fusion  # noqa: F401  (Inductor-IR)

FAMILIES = (canonical, inverse, slices, views, split_cat, unbind_stack, pointwise, casts, embedding, horizontal, grouped_kernels, kernel_fusion)
