"""The canonical op vocabulary every rule is written against.

A graph view (Torch-IR, Aten-IR; Inductor-IR adds its node kinds) classifies each node into a
``Call``: a canonical op name plus its arguments under canonical names, whatever spelling
the node used (``torch.concat`` or ``Tensor.split`` or ``aten.split_with_sizes``,
positional or keyword, negative or non-negative dims). Rules only ever see ``Call``s, and
emit new ops through the view under the same names, so a rule written once runs at every
level.

Argument conventions (the view normalizes to these where the shape is known):

* dims are non-negative ``int``;
* ``split.sizes`` is a ``list[int]`` of section sizes (an int split size is expanded);
* ``slice.start``/``end`` are clamped to ``[0, size]``; ``end`` is never ``None``;
* ``squeeze.dims`` is a ``tuple[int, ...]`` or ``None`` (all size-1 dims);
* ``view``/``reshape``/``permute`` shapes and dims are lists;
* ``cast.dtype`` is a ``torch.dtype``, and a ``cast`` always changes its input's dtype
  (a view classifies a same-dtype conversion as nothing: at Torch-IR it returns its
  input itself, an alias, not a copy).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch.fx as fx

# op name -> canonical argument names, in positional order.
SCHEMAS: dict[str, tuple[str, ...]] = {
    # data movement
    "split": ("input", "sizes", "dim"),
    "unbind": ("input", "dim"),
    "cat": ("tensors", "dim"),
    "stack": ("tensors", "dim"),
    "getitem": ("input", "index"),
    "slice": ("input", "dim", "start", "end", "step"),
    "select": ("input", "dim", "index"),
    "view": ("input", "shape"),
    "reshape": ("input", "shape"),
    "permute": ("input", "dims"),
    "transpose": ("input", "dim0", "dim1"),
    "squeeze": ("input", "dims"),
    "unsqueeze": ("input", "dim"),
    "flatten": ("input", "start_dim", "end_dim"),
    "unflatten": ("input", "dim", "sizes"),
    "movedim": ("input", "source", "destination"),
    "expand": ("input", "shape"),
    "clone": ("input",),
    "contiguous": ("input",),
    # dtype conversion: Torch-IR's x.to(dtype) / x.float() / x.half() / x.bfloat16() /
    # x.type(dtype), Aten-IR's prims.convert_element_type and aten._to_copy (dtype only),
    # which is how AOTAutograd writes the casts autocast inserts
    "cast": ("input", "dtype"),
    # matmuls
    "linear": ("input", "weight", "bias"),
    "mm": ("input", "mat2"),
    "addmm": ("bias", "input", "mat2", "beta", "alpha"),
    "bmm": ("input", "mat2"),
    "baddbmm": ("bias", "input", "mat2", "beta", "alpha"),
    "matmul": ("input", "other"),
    "einsum": ("equation", "operands"),
    # reductions
    "sum": ("input", "dims", "keepdim"),
    # normalization
    "layer_norm": ("input", "normalized_shape", "weight", "bias", "eps"),
    # pointwise with extra arguments
    "clamp": ("input", "min", "max"),
    "nan_to_num": ("input", "nan", "posinf", "neginf"),
    "dropout": ("input", "p", "training"),
    "detach": ("input",),
    "gelu": ("input", "approximate"),
    "leaky_relu": ("input", "negative_slope"),
    "add": ("input", "other", "alpha"),
    "sub": ("input", "other", "alpha"),
    "mul": ("input", "other"),
    "div": ("input", "other", "rounding_mode"),
    # embedding lookups: Torch-IR's F.embedding / F.embedding_bag, Aten-IR's aten.embedding and
    # aten._embedding_bag[_forward_only] (a tuple result: the pooled output is item 0).
    # embedding_bag.mode is "sum" / "mean" / "max"; padding_idx is None or an int.
    "embedding": ("input", "weight", "padding_idx", "max_norm", "scale_grad_by_freq", "sparse"),
    "embedding_bag": ("input", "weight", "offsets", "max_norm", "scale_grad_by_freq", "mode", "sparse", "per_sample_weights", "include_last_offset", "padding_idx"),
}

# Values of omitted arguments when a rule emits an op.
DEFAULTS: dict[str, dict[str, Any]] = {
    "slice": {"step": 1},
    "squeeze": {"dims": None},
    "flatten": {"start_dim": 0, "end_dim": -1},
    "linear": {"bias": None},
    "addmm": {"beta": 1, "alpha": 1},
    "baddbmm": {"beta": 1, "alpha": 1},
    "layer_norm": {"weight": None, "bias": None, "eps": 1e-5},
    "clamp": {"min": None, "max": None},
    "nan_to_num": {"nan": 0.0, "posinf": None, "neginf": None},
    "dropout": {"p": 0.5, "training": True},
    "sum": {"keepdim": False},
    "gelu": {"approximate": "none"},
    "leaky_relu": {"negative_slope": 0.01},
    "add": {"alpha": 1},
    "sub": {"alpha": 1},
    "div": {"rounding_mode": None},
}

# Elementwise ops of one tensor argument and no other arguments.
UNARY_POINTWISE: tuple[str, ...] = (
    "relu",
    "tanh",
    "sigmoid",
    "silu",
    "exp",
    "log",
    "neg",
    "abs",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "square",
)
for _name in UNARY_POINTWISE:
    SCHEMAS[_name] = ("input",)

BINARY_POINTWISE: tuple[str, ...] = ("add", "sub", "mul", "div")

# Elementwise ops (every output element depends only on the same-index input elements,
# with broadcasting for the binary ones). Dropout is elementwise but random.
POINTWISE: frozenset[str] = frozenset(
    UNARY_POINTWISE + BINARY_POINTWISE + ("clamp", "nan_to_num", "gelu", "leaky_relu", "detach", "cast")
)

def is_pointwise(op: str) -> bool:
    """Elementwise, named in the vocabulary or a level's generic elementwise op."""
    return op in POINTWISE or op.startswith("pointwise:")


# Ops whose outputs alias (are views of) their input.
VIEW_OPS: frozenset[str] = frozenset(
    {
        "split",
        "unbind",
        "getitem",
        "slice",
        "select",
        "view",
        "reshape",  # may copy; treated as aliasing to stay conservative
        "permute",
        "transpose",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "movedim",
        "expand",
        "detach",
        "contiguous",  # returns self when already contiguous
    }
)

# Ops that return a tuple/list of tensors; their users are ``getitem`` nodes.
MULTI_OUTPUT: frozenset[str] = frozenset({"split", "unbind"})



def register_ops(schemas: dict[str, tuple[str, ...]]) -> None:
    """Add canonical ops (e.g. a level's own node kinds, such as Inductor-IR scheduler
    node kinds) so patterns and builders can name them. Existing ops cannot change."""
    for name, args in schemas.items():
        if name in SCHEMAS and SCHEMAS[name] != tuple(args):
            raise ValueError(f"canonical op {name!r} already has arguments {SCHEMAS[name]}")
        SCHEMAS[name] = tuple(args)


# Canonical ops that are one callable at every FX level (torch.library custom ops such as
# ``torch.ops.optimus.grouped_embedding_bag.default``): name -> OpOverload. Their canonical
# arguments are the overload's schema names, in order; the views emit them as they are.
EXTERN_OPS: dict[str, Any] = {}


def register_extern_op(name: str, target: Any) -> None:
    """Let rules emit the ``OpOverload`` ``target`` as canonical op ``name`` at every FX level."""
    register_ops({name: tuple(a.name for a in target._schema.arguments)})
    EXTERN_OPS[name] = target


@dataclasses.dataclass(frozen=True)
class ParamRef:
    """A module parameter named by its qualified path (``call_module`` graphs).

    ``Builder.value`` turns it into a ``get_attr`` node when a replacement uses it.
    """

    target: str


@dataclasses.dataclass(frozen=True)
class Call:
    """A node seen through the canonical vocabulary.

    ``args`` maps canonical argument names (``SCHEMAS[op]``) to values: ``fx.Node``s,
    Python constants, or lists of them.
    """

    op: str
    node: fx.Node
    args: dict[str, Any]

    def __getitem__(self, name: str) -> Any:
        return self.args[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.args.get(name, default)

    @property
    def input(self) -> Any:
        return self.args.get("input")
