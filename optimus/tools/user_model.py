"""Your own model on the command line: ``MODULE:FACTORY`` and ``--inputs``.

``optimus explain MODULE:FACTORY`` and ``optimus bench --model MODULE:FACTORY`` build a
model from a function of yours:

* ``MODULE`` is an importable module name (``mypkg.models``; the current directory is on
  the import path, as with ``python -m``) or a path to a Python file (``models/ranker.py``);
* ``FACTORY`` names a callable in it (``build``, or ``Ranker.small`` for an attribute);
* the factory is called with no arguments, under ``torch.manual_seed(seed)`` (the same
  weights every time the model is built), and returns either an ``nn.Module`` or a pair
  ``(module, example_inputs)``; ``example_inputs`` is one tensor or a tuple/list of the
  positional arguments of ``module(...)`` (tensors, or objects with ``.to(device)`` such
  as TorchRec's ``KeyedJaggedTensor``).

``--inputs`` gives (or replaces) the example inputs: a comma list of
``SHAPE[:DTYPE[:HIGH]]``, e.g. ``64x128`` (a float32 tensor from ``torch.randn``) or
``64x8:int64:1000`` (integers drawn from ``[0, 1000)``; ``HIGH`` defaults to 2). A model
needs one or the other. The inputs are drawn from ``seed`` too.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from typing import Any

import torch
from torch import nn

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float": torch.float32, "float16": torch.float16, "half": torch.float16,
    "bfloat16": torch.bfloat16, "float64": torch.float64, "double": torch.float64,
    "int64": torch.int64, "long": torch.int64, "int32": torch.int32, "int": torch.int32, "bool": torch.bool,
}
SPEC_HELP = ("MODULE:FACTORY: a module name (or a .py file) and a function in it returning an nn.Module "
             "or (module, example_inputs)")
INPUTS_HELP = ("example inputs: a comma list of SHAPE[:DTYPE[:HIGH]], e.g. 64x128 or 64x8:int64:1000 "
               "(integers in [0, HIGH)); replaces the inputs the factory returns")
_SHAPE = re.compile(r"^\d+(x\d+)*$")


def is_spec(text: str) -> bool:
    """``text`` names a user's model (``MODULE:FACTORY``), not a built-in model name."""
    module, sep, factory = text.rpartition(":")
    return bool(sep and module and factory)


def parse_inputs(text: str) -> list[tuple[tuple[int, ...], torch.dtype, int]]:
    """``"64x128,64x8:int64:1000"`` -> ``[((64, 128), float32, 2), ((64, 8), int64, 1000)]``."""
    out = []
    for item in (t.strip() for t in text.split(",")):
        if not item:
            continue
        shape, _, rest = item.partition(":")
        dtype_name, _, high = rest.partition(":")
        if not _SHAPE.match(shape):
            raise ValueError(f"--inputs: {item!r}: the shape must be sizes joined by 'x', e.g. 64x128")
        dtype_name = dtype_name or "float32"
        if dtype_name not in DTYPES:
            raise ValueError(f"--inputs: {item!r}: unknown dtype {dtype_name!r}; choose from: {', '.join(DTYPES)}")
        if high and not high.isdigit():
            raise ValueError(f"--inputs: {item!r}: HIGH must be a positive integer")
        out.append((tuple(int(s) for s in shape.split("x")), DTYPES[dtype_name], int(high or 2)))
    if not out:
        raise ValueError("--inputs: no input given")
    return out


def make_inputs(text: str, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """The tensors ``--inputs text`` describes, drawn from a generator seeded with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    tensors = []
    for shape, dtype, high in parse_inputs(text):
        if dtype.is_floating_point:
            tensors.append(torch.randn(shape, generator=gen).to(dtype))
        else:
            tensors.append(torch.randint(0, high, shape, generator=gen).to(dtype))
    return tuple(tensors)


def _import(module: str) -> Any:
    if module.endswith(".py") or os.sep in module or "/" in module:
        path = os.path.abspath(module)
        if not os.path.isfile(path):
            raise ValueError(f"no such file: {module}")
        name = "_optimus_user_" + re.sub(r"\W", "_", os.path.splitext(os.path.basename(path))[0])
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
        return mod
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as ``python -m`` would: the user's own package in the current directory
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise ValueError(f"cannot import {module!r} ({e}); run from the folder that holds it or give a .py path") from None
        raise


def load_factory(spec: str) -> Any:
    """The callable ``MODULE:FACTORY`` names."""
    if not is_spec(spec):
        raise ValueError(f"{spec!r} is not MODULE:FACTORY ({SPEC_HELP})")
    module, _, factory = spec.rpartition(":")
    obj = _import(module)
    for part in factory.split("."):
        if not hasattr(obj, part):
            raise ValueError(f"{module!r} has no {factory!r}")
        obj = getattr(obj, part)
    if not callable(obj):
        raise ValueError(f"{spec}: {factory!r} is not callable")
    return obj


def _to(value: Any, device: torch.device) -> Any:
    return value.to(device) if hasattr(value, "to") else value


def load(spec: str, inputs: str | None = None, device: str | torch.device = "cpu", seed: int = 0) -> tuple[nn.Module, tuple[Any, ...]]:
    """Build the user's model ``spec`` (``MODULE:FACTORY``) on ``device``: the module and
    its example inputs (``inputs``, an ``--inputs`` text, wins over the factory's own)."""
    factory = load_factory(spec)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        made = factory()
    given: Any = None
    if isinstance(made, tuple) and len(made) == 2 and isinstance(made[0], nn.Module):
        made, given = made
    if not isinstance(made, nn.Module):
        raise ValueError(f"{spec} returned {type(made).__name__}; it must return an nn.Module or (module, example_inputs)")
    if inputs is not None:
        args: tuple[Any, ...] = make_inputs(inputs, seed)
    elif given is None:
        raise ValueError(f"{spec} returned a module without example inputs: give them with --inputs "
                         "(e.g. --inputs 64x128), or return (module, example_inputs) from the factory")
    else:
        args = tuple(given) if isinstance(given, (tuple, list)) else (given,)
    dev = torch.device(device)
    return made.to(dev), tuple(_to(a, dev) for a in args)
