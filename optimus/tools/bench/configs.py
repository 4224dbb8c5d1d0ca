"""The configurations ``optimus bench`` compares, and upstream's Optimus options.

Each configuration turns a fresh ``nn.Module`` into the callable that is measured,
inside a context that holds whatever Inductor settings it needs (compilation happens
lazily on the first call, so the settings must stay in force while the step runs).
``wrap(model, **compile_kwargs)`` takes extra ``torch.compile`` keyword arguments
(``dynamic=True`` from ``--dynamic``); eager ignores them.

The ``*-cudagraphs`` pair compiles with ``mode="reduce-overhead"``: CUDA graphs remove
the launch overhead of many small kernels but not the memory traffic of the copies
Optimus deletes, so both pairs (``inductor``/``optimus`` and
``inductor-cudagraphs``/``optimus-cudagraphs``) are reported. On CPU Inductor skips
CUDA graphs and the pair runs as plain compiled code (the row says so).
"""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch import nn


@dataclass(frozen=True)
class BenchConfig:
    name: str
    description: str
    compiled: bool
    wrap: Callable[..., Callable[..., Any]]  # wrap(model, **compile_kwargs)
    context: Callable[[], ContextManager[Any]]
    cudagraphs: bool = False  # compiled with mode="reduce-overhead"


def _eager(model: nn.Module, **compile_kwargs: Any) -> Callable[..., Any]:
    return model


def _inductor(mode: str | None = None) -> Callable[..., Callable[..., Any]]:
    def wrap(model: nn.Module, **compile_kwargs: Any) -> Callable[..., Any]:
        if mode is not None:
            compile_kwargs["mode"] = mode
        return torch.compile(model, fullgraph=True, **compile_kwargs)

    return wrap


def _optimus(
    passes: Any, mode: str | None = None, tune: bool = False, pack: bool | None = None
) -> Callable[..., Callable[..., Any]]:
    def wrap(model: nn.Module, **compile_kwargs: Any) -> Callable[..., Any]:
        import optimus

        if mode is not None:
            compile_kwargs["mode"] = mode
        if pack is not None:  # None: optimus.compile's default (packing.pack_by_default)
            compile_kwargs["pack_parameters"] = pack
        return optimus.compile(model, passes=passes, fullgraph=True, tune=tune, **compile_kwargs)

    return wrap


def optimus_mode_unsupported() -> str | None:
    """Why ``optimus.compile(..., mode="reduce-overhead")`` does not work here, or None if it does.

    Found out, not assumed: compiles and runs a one-op function on the CPU (where
    Inductor ignores CUDA graphs) and reports a ``TypeError`` about ``mode``, raised by
    ``optimus.compile`` itself or by its backend when Dynamo calls it.
    """
    import optimus

    torch._dynamo.reset()
    try:
        fn = optimus.compile(lambda x: x * 2 + 1, passes="none", mode="reduce-overhead", fullgraph=True)
        fn(torch.ones(4))
    except Exception as e:  # noqa: BLE001 - classified below
        inner = getattr(e, "inner_exception", None) or e.__cause__ or e
        for err in (e, inner):
            if isinstance(err, TypeError) and "mode" in str(err):
                return f"optimus.compile rejects mode=: {type(err).__name__}: {str(err).splitlines()[0]}"
        raise
    finally:
        torch._dynamo.reset()
    return None


@contextlib.contextmanager
def _nothing() -> Iterator[None]:
    yield


# --- upstream PyTorch's own Optimus passes ------------------------------------------


def _needs_fbgemm(obj: Any) -> bool:
    """True if a fusion class (or anything it defines) calls into fbgemm."""
    try:
        src = inspect.getsource(obj if inspect.isclass(obj) else type(obj))
    except (OSError, TypeError):
        return False
    return "fbgemm" in src


def upstream_fusion_options() -> dict[str, dict[str, dict[str, Any]]]:
    """Every upstream pre-/post-grad Optimus option this torch supports, fbgemm-free.

    Names come from the registries in ``torch._inductor.fx_passes`` (group/batch fusions
    and the split/cat pattern passes) so the list follows the installed version.
    Excluded: fusions whose implementation calls fbgemm (``group_linear``: a
    Meta-internal grouped GEMM) and the names upstream itself excludes from its
    post-grad Optimus loop (``OPTIMUS_EXCLUDE_POST_GRAD``, e.g. quantization passes).
    """
    pre: dict[str, dict[str, Any]] = {}
    post: dict[str, dict[str, Any]] = {}
    try:
        from torch._inductor.fx_passes import group_batch_fusion as gbf
    except ImportError:  # pragma: no cover - very old or very new torch
        gbf = None  # type: ignore[assignment]
    try:
        from torch._inductor.fx_passes import split_cat
    except ImportError:  # pragma: no cover
        split_cat = None  # type: ignore[assignment]
    try:
        from torch._inductor.utils import OPTIMUS_EXCLUDE_POST_GRAD as excluded
    except ImportError:  # pragma: no cover
        excluded = []
    excluded = set(excluded)

    if gbf is not None:
        for name, cls in getattr(gbf, "PRE_GRAD_FUSIONS", {}).items():
            if not _needs_fbgemm(cls):
                pre[name] = {}
        for name, cls in getattr(gbf, "POST_GRAD_FUSIONS", {}).items():
            if name not in excluded and not _needs_fbgemm(cls):
                post[name] = {}
    if split_cat is not None:
        for name in getattr(split_cat, "PRE_GRAD_PATTERNS", {}):
            pre.setdefault(name, {})
        for name in getattr(split_cat, "POST_GRAD_PATTERNS", {}):
            if name not in excluded:
                post.setdefault(name, {})
    return {"pre_grad": pre, "post_grad": post}


@contextlib.contextmanager
def _upstream_context() -> Iterator[None]:
    from torch._inductor import config as inductor_config

    opts = upstream_fusion_options()
    with inductor_config.patch(
        pre_grad_fusion_options=opts["pre_grad"], post_grad_fusion_options=opts["post_grad"]
    ):
        yield


CONFIGS: dict[str, BenchConfig] = {
    c.name: c
    for c in [
        BenchConfig("eager", "PyTorch eager", False, _eager, _nothing),
        BenchConfig("inductor", "torch.compile, default Inductor", True, _inductor(), _nothing),
        BenchConfig(
            "upstream",
            "torch.compile with upstream's pre/post_grad_fusion_options all on (fbgemm-free)",
            True,
            _inductor(),
            _upstream_context,
        ),
        BenchConfig("optimus-vertical", "optimus.compile(passes='vertical')", True, _optimus("vertical"), _nothing),
        BenchConfig(
            "optimus-horizontal", "optimus.compile(passes='horizontal')", True, _optimus("horizontal"), _nothing
        ),
        BenchConfig("optimus", "optimus.compile(passes='all')", True, _optimus("all"), _nothing),
        BenchConfig("optimus-auto", "optimus.compile(passes='auto'): the planner chooses", True, _optimus("auto"), _nothing),
        BenchConfig(
            "optimus-auto-tune",
            "optimus.compile(passes='auto', tune=True): the planner measures candidate plans per graph",
            True,
            _optimus("auto", tune=True),
            _nothing,
        ),
        BenchConfig(
            "optimus-packed",
            "optimus.compile(passes='all', pack_parameters=True): grouped weights packed once (docs/packing.md)",
            True,
            _optimus("all", pack=True),
            _nothing,
        ),
        BenchConfig(
            "optimus-unpacked",
            "optimus.compile(passes='all', pack_parameters=False): the default without packed weights",
            True,
            _optimus("all", pack=False),
            _nothing,
        ),
        BenchConfig(
            "optimus-auto-packed",
            "optimus.compile(passes='auto', pack_parameters=True): the planner on packed weights",
            True,
            _optimus("auto", pack=True),
            _nothing,
        ),
        BenchConfig(
            "optimus-fx",
            "optimus.compile with the Torch-IR and Aten-IR rules only (no Inductor-IR passes)",
            True,
            _optimus({"torch_ir": "all", "aten_ir": "all", "inductor_ir": "none"}),  # type: ignore[arg-type]
            _nothing,
        ),
        BenchConfig(
            "inductor-cudagraphs",
            "torch.compile(mode='reduce-overhead'): default Inductor with CUDA graphs",
            True,
            _inductor("reduce-overhead"),
            _nothing,
            cudagraphs=True,
        ),
        BenchConfig(
            "optimus-cudagraphs",
            "optimus.compile(passes='all', mode='reduce-overhead'): Optimus with CUDA graphs",
            True,
            _optimus("all", "reduce-overhead"),
            _nothing,
            cudagraphs=True,
        ),
        BenchConfig(
            "optimus-packed-cudagraphs",
            "optimus.compile(passes='all', pack_parameters=True, mode='reduce-overhead')",
            True,
            _optimus("all", "reduce-overhead", pack=True),
            _nothing,
            cudagraphs=True,
        ),
        BenchConfig(
            "optimus-auto-cudagraphs",
            "optimus.compile(passes='auto', mode='reduce-overhead'): the planner, with CUDA graphs",
            True,
            _optimus("auto", "reduce-overhead"),
            _nothing,
            cudagraphs=True,
        ),
    ]
}

CONFIG_NAMES = list(CONFIGS)
