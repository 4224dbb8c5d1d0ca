"""Optimus's ``torch.backends`` entry point: its ``TORCH_LOGS`` names, known to torch
before torch parses ``TORCH_LOGS``.

``import torch`` (2.13 and later) calls every ``torch.backends`` entry point, then
parses ``TORCH_LOGS``. This module is outside the ``optimus`` package on purpose:
importing ``optimus`` pulls in ``torch._dynamo`` (seconds, on every ``import torch``,
in the middle of torch's own import). It runs ``optimus/core/torch_logging.py``, which
imports nothing from Optimus, straight from its file, and never raises: an entry point
that raises makes ``import torch`` fail.
"""

from __future__ import annotations

import importlib.util
import os


def autoload() -> None:
    """Register ``optimus`` and its artifact names with ``torch._logging``."""
    try:
        spec = importlib.util.find_spec("optimus")  # locates the package, imports nothing
        if spec is None or not spec.submodule_search_locations:
            return
        for folder in spec.submodule_search_locations:
            path = os.path.join(folder, "core", "torch_logging.py")
            if os.path.isfile(path):
                break
        else:
            return
        module_spec = importlib.util.spec_from_file_location("_optimus_torch_logging", path)
        if module_spec is None or module_spec.loader is None:
            return
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
        module.register()
    except Exception:  # noqa: BLE001 - never break `import torch`
        return
