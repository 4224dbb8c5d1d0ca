"""The activations a kernel family fuses as an epilogue: names, codes and the plain-torch math.

``ACTIVATIONS`` maps a name to the code a kernel's ``ACT`` constexpr takes (the Triton side is
``activation_jit.py``). The backward of an activation needs either its output ``y``
(``USES_OUTPUT``: relu, sigmoid, tanh) or its input, the pre-activation ``z`` (``NEEDS_PREACT``:
gelu, silu); :func:`saved_activation` picks which one a forward saves.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F

# activation name -> code used by the kernels (constexpr ACT)
ACTIVATIONS = {"none": 0, "relu": 1, "gelu": 2, "silu": 3, "sigmoid": 4, "tanh": 5}
# activations whose derivative needs the pre-activation z (saved by the forward);
# the others differentiate from the output y.
NEEDS_PREACT = ("gelu", "silu")
USES_OUTPUT = ("relu", "sigmoid", "tanh")


def activation_code(activation) -> str:
    """Normalise the ``activation`` argument to one of ``ACTIVATIONS``' names."""
    if activation is None:
        return "none"
    if not isinstance(activation, str) or activation.lower() not in ACTIVATIONS:
        raise ValueError(
            f"activation must be None or one of {sorted(k for k in ACTIVATIONS if k != 'none')}, "
            f"got {activation!r}"
        )
    return activation.lower()


def saved_activation(act: str, y, pre):
    """What the backward needs of its activation ``act`` (a normalised name): the
    pre-activation, the output, or nothing."""
    return pre if act in NEEDS_PREACT else (y if act in USES_OUTPUT else None)


def apply_activation(z: torch.Tensor, act: str) -> torch.Tensor:
    if act == "none":
        return z
    if act == "relu":
        return F.relu(z)
    if act == "gelu":
        return F.gelu(z)
    if act == "silu":
        return F.silu(z)
    if act == "sigmoid":
        return torch.sigmoid(z)
    if act == "tanh":
        return torch.tanh(z)
    raise ValueError(f"unknown activation {act!r}")


def activation_grad(dy: torch.Tensor, aux: Optional[torch.Tensor], act: str) -> torch.Tensor:
    """dz from dy and aux (y for relu/sigmoid/tanh, z for gelu/silu); fp32 or fp64 math."""
    if act == "none":
        return dy
    if act == "relu":
        return torch.where(aux > 0, dy, torch.zeros_like(dy))
    if act == "gelu":
        cdf = 0.5 * (1.0 + torch.erf(aux * (1.0 / math.sqrt(2.0))))
        pdf = torch.exp(-0.5 * aux * aux) / math.sqrt(2.0 * math.pi)
        return dy * (cdf + aux * pdf)
    if act == "silu":
        s = torch.sigmoid(aux)
        return dy * (s * (1.0 + aux * (1.0 - s)))
    if act == "sigmoid":
        return dy * aux * (1.0 - aux)
    if act == "tanh":
        return dy * (1.0 - aux * aux)
    raise ValueError(f"unknown activation {act!r}")
