"""Private PyTorch APIs the ``torch.compile`` integration uses, behind guards, in one place.

Optimus plugs into Inductor below its public surface: it calls ``compile_fx`` with its own
``inner_compile``, reads and chains Inductor's custom-pass hooks, turns ``mode=`` /
``options=`` into Inductor config patches the way ``torch.compile`` does, and must let
Dynamo's own control-flow exceptions pass untouched. Each of those touches a private name
that moves between releases; this module is the only place that names them (the
scheduler-level ones live in ``optimus.inductor_ir.inductor_api``). Checked on torch 2.11, 2.13
and 2.15.
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator

import torch

try:
    from torch._inductor import config as inductor_config
except ImportError:  # pragma: no cover - torch without Inductor
    inductor_config = None  # type: ignore[assignment]

try:  # both 2.11 and 2.13 have it
    from torch._inductor.custom_graph_pass import CustomGraphPass
except ImportError:  # pragma: no cover
    CustomGraphPass = None  # type: ignore[assignment,misc]

try:  # 2.13+: post-grad passes that are told whether the graph is an inference graph
    from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass
except ImportError:  # torch 2.11
    CustomInferenceAwareGraphPass = None  # type: ignore[assignment,misc]

# The hooks whose values Optimus installs (and chains with whatever the user set there).
GRAPH_HOOKS = ("pre_grad_custom_pass", "post_grad_custom_pre_pass")
SCHEDULER_HOOKS = ("_pre_fusion_custom_pass", "_post_fusion_custom_pass")
HOOKS = GRAPH_HOOKS + SCHEDULER_HOOKS


def compile_fx(gm: torch.fx.GraphModule, example_inputs: list[Any], inner_compile: Callable[..., Any] | None, config_patches: dict[str, Any]) -> Any:
    """Inductor's ``compile_fx`` with our ``inner_compile`` (called once per forward,
    backward or inference graph, lazily for the backward), under ``config_patches``."""
    from torch._inductor.compile_fx import compile_fx as _compile_fx

    if inner_compile is None:
        return _compile_fx(gm, example_inputs, config_patches=config_patches)
    return _compile_fx(gm, example_inputs, inner_compile=inner_compile, config_patches=config_patches)


def compile_fx_inner(gm: torch.fx.GraphModule, example_inputs: Any, **kwargs: Any) -> Any:
    """Inductor's per-graph compiler (post-grad passes, lowering, scheduling, codegen)."""
    from torch._inductor.compile_fx import compile_fx_inner as _inner

    return _inner(gm, example_inputs, **kwargs)


def mode_options(mode: str | None, options: dict[str, Any] | None, dynamic: bool | None) -> dict[str, Any]:
    """The Inductor config patches ``torch.compile(mode=..., options=...)`` would apply.

    Uses ``torch._TorchCompileInductorWrapper``, so option names and types are validated
    exactly as ``torch.compile`` validates them (an unknown option raises PyTorch's own
    error) and the environment tweaks it makes for CUDA graphs happen too.
    """
    if mode is not None and options is not None:
        raise RuntimeError("Either mode or options can be specified, but both can't be specified at the same time.")
    if not mode and not options:
        return {}
    wrapper_cls = getattr(torch, "_TorchCompileInductorWrapper", None)
    if wrapper_cls is not None:
        try:
            return dict(wrapper_cls(mode, options, dynamic).config)
        except TypeError:  # a different constructor: fall through to the manual path
            pass
    from torch._inductor import list_mode_options  # pragma: no cover - older layouts

    patches: dict[str, Any] = {}
    if mode and mode != "default":
        patches.update(list_mode_options(mode, dynamic))
    patches.update({k.replace("-", "_"): v for k, v in (options or {}).items()})
    return patches


def user_hooks(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What the user set in Inductor's custom-pass hooks (global config, then the
    ``options`` of this compile), so Optimus can chain instead of replacing them."""
    found: dict[str, Any] = {}
    for hook in HOOKS:
        value = getattr(inductor_config, hook, None) if inductor_config is not None else None
        if extra and hook in extra:
            value = extra[hook]
        if value is not None and value != [] and value != ():
            found[hook] = value
    return found


def as_pass_list(value: Any) -> list[Any]:
    """A hook's value as a list of passes (2.13 accepts lists in graph hooks; 2.11 one)."""
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        return list(value)
    return [value]


def pass_uuid(p: Any) -> Any:
    """A pass's cache identity: its ``uuid()`` if it has one, else ``None`` (Inductor then
    bypasses its FX graph cache, as it would for that pass without Optimus)."""
    fn = getattr(p, "uuid", None)
    if fn is None:
        return None
    try:
        return fn()
    except Exception:
        return None


def inference_aware(p: Any) -> bool:
    return CustomInferenceAwareGraphPass is not None and isinstance(p, CustomInferenceAwareGraphPass)


def passthrough_exceptions() -> tuple[type[BaseException], ...]:
    """Exceptions Dynamo and AOTAutograd use to steer compilation (restart the analysis,
    skip a frame, tensorify a scalar...): not failures, never caught by Optimus."""
    found: list[type[BaseException]] = []
    try:
        from torch._dynamo import exc
    except ImportError:  # pragma: no cover
        return ()
    for name in ("RestartAnalysis", "SkipFrame", "TensorifyScalarRestartAnalysis", "UnspecializeRestartAnalysis"):
        cls = getattr(exc, name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            found.append(cls)
    return tuple(found)


@contextlib.contextmanager
def patched(patches: dict[str, Any]) -> Iterator[None]:
    """Inductor config patches for the duration of the block."""
    if not patches or inductor_config is None:
        yield
        return
    with inductor_config.patch(patches):
        yield


def cache_hit_counts() -> dict[str, int]:
    """FX-graph and AOTAutograd cache hits so far (to report graphs that came from a cache)."""
    from torch._dynamo.utils import counters

    return {
        "fx_graph_cache": int(counters["inductor"].get("fxgraph_cache_hit", 0)),
        "aot_autograd_cache": int(counters["aot_autograd"].get("autograd_cache_hit", 0)),
    }


@contextlib.contextmanager
def separate_compile_metrics() -> Iterator[None]:
    """Run a nested ``compile_fx`` (the planner's ``tune=True`` trials) in a metrics context
    of its own: Dynamo's per-thread compile metrics refuse a second ``is_forward`` etc. in
    the frame's context. Nothing is recorded for the trials. Where the layout differs, a
    no-op (the trial may then fail, and tuning says so)."""
    try:
        from torch._dynamo import utils as dynamo_utils
        from torch._dynamo.metrics_context import MetricsContext

        tls = dynamo_utils._metrics_context_tls
    except (ImportError, AttributeError):  # pragma: no cover - other layouts
        yield
        return
    saved = getattr(tls, "metrics_context", None)
    tls.metrics_context = MetricsContext(on_exit=lambda *args, **kwargs: None)
    try:
        with tls.metrics_context:
            yield
    finally:
        if saved is None:
            del tls.metrics_context
        else:
            tls.metrics_context = saved


# --- TF32 flags: two torch APIs -------------------------------------------------------
# torch >= 2.9 has ``fp32_precision`` ("ieee" / "tf32" / "none": inherit) next to the legacy
# ``allow_tf32`` booleans, and once TF32 was set through the new one, *reading* the legacy flag
# raises RuntimeError ("mix of the legacy and new APIs"). Setting the legacy flag stays allowed.


def cuda_matmul_allows_tf32() -> bool:
    """Whether torch's fp32 CUDA matmuls may run in TF32 now (either API): the kernels' own
    reader (``kernels/runtime/backend.torch_allows_tf32``), so both sides agree."""
    from .kernels.runtime.backend import torch_allows_tf32

    return torch_allows_tf32()


@contextlib.contextmanager
def tf32(enabled: bool, cudnn: bool = False) -> Iterator[None]:
    """TF32 on or off for CUDA matmuls (and cuDNN with ``cudnn=True``) inside; restored after,
    through the API that holds the old setting."""
    backends = [torch.backends.cuda.matmul] + ([torch.backends.cudnn] if cudnn else [])
    # the new API's value where torch has it (reading the legacy flag could raise), else the legacy one
    old = [(b, getattr(b, "fp32_precision", None)) for b in backends]
    old = [(b, p if isinstance(p, str) else bool(b.allow_tf32)) for b, p in old]
    for b in backends:
        b.allow_tf32 = enabled
    try:
        yield
    finally:
        for b, value in old:
            if isinstance(value, str):
                b.fp32_precision = value
            else:  # pragma: no cover - torch < 2.9
                b.allow_tf32 = value


# --- Backward graphs: the strides Inductor hands gradients back in --------------------
# ``compile_fx`` records each output's strides before the post-grad passes run
# (``record_original_output_strides``, 2.11 to 2.15) and, backward outputs being user visible
# (``bw_outputs_user_visible``), copies an output computed in other strides back to them.
ORIGINAL_OUTPUT_STRIDES = "original_output_strides"


def _concrete(values: Any) -> bool:
    return all(type(v) is int for v in values)


def adopt_gradient_layouts(graph: torch.fx.Graph) -> list[str]:
    """Let a backward graph return each gradient in the strides the rewritten graph computes
    it in, where those are row-major and the strides recorded before the post-grad passes
    were not; returns the outputs changed.

    Why: Optimus's Torch-IR batching makes AOTAutograd trace a weight gradient as a slice of
    a transposed batched product (strides (1, N) for an (N, K) weight); the Aten-IR rule
    ``transpose_bmm_for_gradient_layout`` computes it row-major instead, and without this
    Inductor would copy each gradient back to the traced strides, after which AccumulateGrad
    copies it again into the parameter's row-major layout. A gradient's strides are not part
    of its meaning (autograd accepts any; AccumulateGrad copies what does not match its
    parameter), so only row-major results replace non-row-major records, and only where
    every size and stride is a plain int (a symbolic one is left as recorded: comparing it
    would add a guard).
    """
    out = graph.find_nodes(op="output")
    if not out:
        return []
    node = out[0]
    recorded = node.meta.get(ORIGINAL_OUTPUT_STRIDES)
    args = node.args[0] if isinstance(node.args[0], (tuple, list)) else node.args
    if not isinstance(recorded, list) or len(recorded) != len(args):
        return []
    changed = []
    for i, (arg, strides) in enumerate(zip(args, recorded)):
        val = arg.meta.get("val") if isinstance(arg, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or strides is None or len(strides) != val.dim():
            continue
        sizes, new = tuple(val.shape), tuple(val.stride())
        if not (_concrete(sizes) and _concrete(new) and _concrete(strides)) or new == tuple(strides):
            continue
        if val.is_contiguous() and not _row_major(sizes, tuple(strides)):
            recorded[i] = new
            changed.append(arg.name)
    return changed


def _row_major(sizes: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    expected = 1
    for size, stride in reversed(list(zip(sizes, strides))):
        if size != 1 and stride != expected:
            return False
        expected *= size
    return True
