"""Packed parameters: a group's weights in one buffer, the original Parameters as views of it.

The horizontal rules stack the weights of N identical, independent layers (``batch_linear``:
``stack(w_i)`` feeding one ``bmm``). When each ``w_i`` owns its memory, that stack is a copy
of every weight on every step. ``pack_parameters(model)`` moves each such group into one
buffer, member ``i`` at element ``i * slot``::

    buffer: [ w_0 | pad | w_1 | pad | ... | w_{G-1} | pad ]     slot = numel rounded up to 16 bytes
    w_i.data = buffer[i * slot : i * slot + numel].view(w_i.shape)

so ``stack(w_i)`` is the strided view ``buffer.as_strided((G, *shape), (slot, *strides))``
and costs nothing. A group of members of *different* shapes (towers of different widths) is
laid out concatenated instead, member ``i`` right after member ``i - 1`` with no padding::

    buffer: [ w_0 | w_1 | ... | w_{G-1} ]          w_i at sum(numel(w_j) for j < i)

which is ``cat([w.reshape(-1) for w in ws])``: what the grouped kernels' parameter-list ops
(``grouped_linear_params`` in ``kernels/linear/op.py``, ``batched_layer_norm_params`` in
``kernels/layer_norm/op.py``) read in place. The Parameter objects stay the same objects
(optimizers, hooks, user references hold them); only their storage moves (``Parameter.data = view``, the in-place
storage swap ``nn.Module._apply`` also uses). Values, names, order, ``requires_grad`` and
hooks are unchanged.

What the graph gains (see docs/packing.md): ``batch_linear`` sees at compile time that
the weights lie packed (Dynamo's fake parameters keep their storage and offsets) and emits
``optimus::packed_linear``, which reads the weights through that view instead of stacking
them and hands back weight gradients as rows of one ``(G, N, K)`` buffer in the
parameters' own strides (AccumulateGrad takes them without a copy).

Groups are found from the module structure: sibling child modules of one type with the
same parameter names (the towers of a ``ModuleList``, repeated child modules) give one
group per parameter name, in child order, which is the order the rules stack them when
the forward runs the siblings in order; a ``ParameterList`` / ``ParameterDict`` gives one
group. Where both an outer and an inner repeat propose a parameter, identical shapes win,
then more members, then the inner repeat (``find_groups``). A group is packed only if its members have the same dtype, device,
``requires_grad`` and a contiguous layout, each owns its storage, and no Parameter
appears twice (in the group or elsewhere in the model); otherwise it is declined with the
reason in the returned ``PackReport``.

What undoes the packing (values stay right, only the layout is lost; pack again after):
``model.to(other_dtype_or_device)``, ``load_state_dict(..., assign=True)``,
``copy.deepcopy(model)`` (``Parameter.__deepcopy__`` clones each one), wrapping with FSDP2.
``unpack_parameters(model)`` gives every packed Parameter its own storage again.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Iterable, Sequence

import torch
from torch import nn
from torch.multiprocessing.reductions import StorageWeakRef

from .core.registry import REGISTRY
from .kernels.packed_linear import packed_slot
from .kernels.runtime.params import lies_concatenated

ALIGN_BYTES = 16  # each member starts on a 16-byte boundary (what Inductor assumes of inputs)


@dataclasses.dataclass(frozen=True)
class PackedGroup:
    """One buffer: its members' names in stack order, their shape, and the slot (elements
    from one member's start to the next's)."""

    names: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    slot: int
    already_packed: bool = False
    # "stacked" (identical shapes, member i at i * slot) or "concatenated" (shapes differ,
    # member i right after member i - 1; ``shape`` is then the first member's, ``slot`` 0)
    layout: str = "stacked"
    numel: int = 0  # elements of the buffer, padding included

    @property
    def nbytes(self) -> int:
        elems = self.numel if self.layout == "concatenated" else len(self.names) * self.slot
        return elems * torch.empty((), dtype=self.dtype).element_size()


@dataclasses.dataclass(frozen=True)
class DeclinedGroup:
    """A candidate group left as it was, and why."""

    names: tuple[str, ...]
    reason: str


@dataclasses.dataclass
class PackReport:
    """What ``pack_parameters`` did: the groups packed (or found already packed) and the
    candidate groups it declined, each with its reason."""

    packed: list[PackedGroup] = dataclasses.field(default_factory=list)
    declined: list[DeclinedGroup] = dataclasses.field(default_factory=list)

    @property
    def newly_packed(self) -> list[PackedGroup]:
        return [g for g in self.packed if not g.already_packed]

    def notes(self) -> list[str]:
        """One line per outcome (what ``optimus.compile(pack_parameters=True)`` records)."""
        new = self.newly_packed
        lines = [
            f"pack_parameters: packed {len(new)} group(s), {sum(len(g.names) for g in new)} parameters, "
            f"{sum(g.nbytes for g in new)} bytes; {len(self.packed) - len(new)} already packed; {len(self.declined)} declined"
        ]
        for g in self.packed:
            state = "already packed" if g.already_packed else "packed"
            what = f"{len(g.names)} x {list(g.shape)}" if g.layout == "stacked" else f"{len(g.names)} of different shapes, concatenated"
            lines.append(f"pack_parameters: {state} {_span(g.names)} ({what}, {g.dtype})")
        for d in self.declined:
            lines.append(f"pack_parameters: declined {_span(d.names)}: {d.reason}")
        return lines

    def __str__(self) -> str:
        return "\n".join(self.notes())


def _span(names: Sequence[str]) -> str:
    return f"{names[0]} .. {names[-1]}" if len(names) > 2 else ", ".join(names)


# ------------------------------------------------------------------ layout facts
def _owns_storage(t: torch.Tensor) -> bool:
    """The tensor is the only thing its storage holds (offset 0, exactly its bytes)."""
    return t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size()


def _slot_for(numel: int, element_size: int, align_bytes: int) -> int:
    per = max(1, align_bytes // element_size)
    return max(per, -(-numel // per) * per)


# ------------------------------------------------------------------ discovery
def _param_names(module: nn.Module) -> dict[int, list[str]]:
    """id(Parameter) -> every name it is registered under (duplicates kept)."""
    names: dict[int, list[str]] = collections.defaultdict(list)
    for name, p in module.named_parameters(remove_duplicate=False):
        names[id(p)].append(name)
    return names


def find_groups(module: nn.Module, min_members: int = 2) -> list[tuple[str, ...]]:
    """Candidate groups (qualified parameter names in stack order) from the module
    structure; a parameter is in at most one candidate.

    Every module proposes, per parameter name, the list of its sibling children of one
    type with the same parameter names (and a ``ParameterList`` / ``ParameterDict`` its
    own parameters). Where a parameter is proposed at several levels, the proposal of
    identical shapes wins, then the one with more members, then the inner one: eight
    linears of a ``ModuleList`` inside each of two sequential rounds group by eight
    within a round, not by two across rounds."""
    proposals: list[tuple[int, tuple[str, ...]]] = []  # (depth, names)

    def visit(prefix: str, mod: nn.Module, depth: int) -> None:
        if isinstance(mod, (nn.ParameterList, nn.ParameterDict)):
            names = tuple(prefix + n for n, _ in mod.named_parameters(recurse=False, remove_duplicate=False))
            if len(names) >= min_members:
                proposals.append((depth, names))
        buckets: dict[tuple, list[str]] = collections.defaultdict(list)
        for cname, child in mod.named_children():
            rel = tuple(n for n, _ in child.named_parameters(remove_duplicate=False))
            if rel:
                buckets[(type(child), rel)].append(cname)
        for (_, rel), cnames in buckets.items():
            if len(cnames) >= min_members:
                proposals.extend((depth, tuple(f"{prefix}{c}.{r}" for c in cnames)) for r in rel)
        for cname, child in mod.named_children():
            visit(f"{prefix}{cname}.", child, depth + 1)

    visit("", module, 0)
    params = dict(module.named_parameters(remove_duplicate=False))
    order = {name: i for i, name in enumerate(params)}

    def preference(proposal: tuple[int, tuple[str, ...]]) -> tuple[bool, int, int]:
        depth, names = proposal
        uniform = len({(tuple(params[n].shape), params[n].dtype) for n in names}) == 1
        return (not uniform, -len(names), -depth)

    groups: list[tuple[str, ...]] = []
    claimed: set[str] = set()
    for _, names in sorted(proposals, key=preference):
        if not claimed.intersection(names):
            groups.append(names)
            claimed.update(names)
    return sorted(groups, key=lambda names: order[names[0]])


def _decline_reason(names: Sequence[str], params: Sequence[nn.Parameter], registered: dict[int, list[str]]) -> str | None:
    """Why this group cannot be packed, or ``None``."""
    first_name = {}
    for name, p in zip(names, params):
        if id(p) in first_name:
            return f"{first_name[id(p)]} and {name} are one shared parameter"
        first_name[id(p)] = name
    inside = set(names)
    for name, p in zip(names, params):
        elsewhere = [n for n in registered[id(p)] if n not in inside]
        if elsewhere:
            return f"{name} is also used elsewhere (registered as {elsewhere[0]})"
    p0 = params[0]
    for label, attr in (("dtypes", "dtype"), ("devices", "device")):
        values = {str(getattr(p, attr)) for p in params}
        if len(values) > 1:
            return f"{label} differ ({', '.join(sorted(values))}): one buffer holds one dtype on one device"
    if len({p.requires_grad for p in params}) > 1:
        frozen = [n for n, p in zip(names, params) if not p.requires_grad]
        return f"frozen and trainable members mixed ({frozen[0]} has requires_grad=False)"
    for name, p in zip(names, params):
        if type(p.data) is not torch.Tensor or p.layout != torch.strided:
            return f"{name} is not a dense strided tensor ({type(p.data).__name__}, {p.layout})"
        if not p.is_contiguous():
            return f"{name} is not contiguous (strides {p.stride()})"
    if any(p.numel() == 0 for p in params):
        return "empty parameters"
    for name, p in zip(names, params):
        if not _owns_storage(p):
            return f"{name} shares its storage with other tensors (a view of another tensor, or packed otherwise)"
    return None


# ------------------------------------------------------------------ packing
def pack_parameters(
    module: nn.Module,
    groups: Iterable[Sequence[str]] | None = None,
    *,
    min_members: int = 2,
    align_bytes: int = ALIGN_BYTES,
) -> PackReport:
    """Pack each group of sibling parameters into one contiguous buffer, in place.

    ``groups``: lists of qualified parameter names, each in stack order (default: found
    from the module structure, ``find_groups``). Every member of a packed group keeps its
    Parameter object and value; its storage becomes a slot of the group's buffer (member
    ``i`` at element ``i * slot``, ``slot`` = its element count rounded up to
    ``align_bytes``; the padding is zeros). Returns what was packed and what was declined.
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f"pack_parameters takes an nn.Module, got {type(module).__name__}")
    registered = _param_names(module)
    by_name = dict(module.named_parameters(remove_duplicate=False))
    report = PackReport()
    candidates = find_groups(module, min_members) if groups is None else [tuple(g) for g in groups]
    fsdp = _fsdp_module(module)
    for names in candidates:
        missing = [n for n in names if n not in by_name]
        if missing:
            raise KeyError(f"pack_parameters: no parameter named {missing[0]!r}")
        params = [by_name[n] for n in names]
        if fsdp is not None:  # FSDP frees and re-allocates its parameters' storage itself
            report.declined.append(DeclinedGroup(names, f"FSDP manages these parameters' storage ({fsdp})"))
            continue
        if len(params) < 2:
            report.declined.append(DeclinedGroup(names, "fewer than two members"))
            continue
        slot = packed_slot(params)
        if slot is not None and len(set(map(id, params))) == len(params):
            report.packed.append(PackedGroup(names, tuple(params[0].shape), params[0].dtype, params[0].device, slot, already_packed=True))
            continue
        concatenated = len({tuple(p.shape) for p in params}) > 1 and lies_concatenated(params)
        if concatenated and len(set(map(id, params))) == len(params):
            report.packed.append(PackedGroup(names, tuple(params[0].shape), params[0].dtype, params[0].device, 0,
                                             already_packed=True, layout="concatenated",
                                             numel=sum(p.numel() for p in params)))
            continue
        reason = _decline_reason(names, params, registered)
        if reason is not None:
            report.declined.append(DeclinedGroup(names, reason))
            continue
        report.packed.append(_pack_group(names, params, align_bytes))
    return report


def _fsdp_module(module: nn.Module) -> str | None:
    """Where FSDP (``FullyShardedDataParallel`` or ``fully_shard``) wraps part of ``module``:
    it resizes its flat parameters' storage to shard and gather them, which a packed buffer
    shared by several of them cannot survive."""
    from .distributed import fsdp_types

    types_ = fsdp_types()
    for name, m in module.named_modules():
        if types_ and isinstance(m, types_):
            return f"{type(m).__name__} at {name or 'the model'}"
    return None


def _pack_group(names: Sequence[str], params: Sequence[nn.Parameter], align_bytes: int) -> PackedGroup:
    p0 = params[0]
    if len({tuple(p.shape) for p in params}) > 1:
        return _pack_concatenated(names, params)
    numel, shape = p0.numel(), tuple(p0.shape)
    slot = _slot_for(numel, p0.element_size(), align_bytes)
    buffer = torch.zeros(len(params) * slot, dtype=p0.dtype, device=p0.device)
    with torch.no_grad():
        for i, p in enumerate(params):
            view = buffer[i * slot : i * slot + numel].view(shape)
            view.copy_(p)
            p.data = view  # the same Parameter object, its storage now the buffer's
    return PackedGroup(tuple(names), shape, p0.dtype, p0.device, slot)


def _pack_concatenated(names: Sequence[str], params: Sequence[nn.Parameter]) -> PackedGroup:
    """Members of different shapes, one after another with no padding: the buffer is the
    concatenation of their flat views."""
    p0 = params[0]
    total = sum(p.numel() for p in params)
    buffer = torch.empty(total, dtype=p0.dtype, device=p0.device)
    offset = 0
    with torch.no_grad():
        for p in params:
            view = buffer[offset : offset + p.numel()].view(p.shape)
            view.copy_(p)
            p.data = view
            offset += p.numel()
    return PackedGroup(tuple(names), tuple(p0.shape), p0.dtype, p0.device, 0, layout="concatenated", numel=total)


def unpack_parameters(module: nn.Module) -> list[str]:
    """Give every parameter that shares its storage with another parameter of ``module``
    (a packed one) its own storage again, keeping the Parameter object and its value.
    Returns the names of the parameters moved."""
    params = list(module.named_parameters())
    by_storage: dict[StorageWeakRef, int] = collections.Counter(StorageWeakRef(p.untyped_storage()) for _, p in params)
    moved = []
    with torch.no_grad():
        for name, p in params:
            if by_storage[StorageWeakRef(p.untyped_storage())] > 1:
                p.data = p.data.clone(memory_format=torch.contiguous_format)
                moved.append(name)
    return moved


# optimus.compile(model, passes=<a fixed preset>) packs by default where the H200 measured
# packing to pay (docs/packing.md): "all" or another fixed preset, parameters on CUDA,
# no CUDA graphs. Under the default passes ("auto") it does not. The
# reasons below are what the report says where it does not pack by default.
NOT_BY_DEFAULT_CUDAGRAPHS = (
    "not by default under CUDA graphs: measured slower there in training "
    "(H200: hetero_towers 1.41x -> 1.13x, towers32 1.16x -> 0.99x Inductor's CUDA graphs)"
)
NOT_BY_DEFAULT_PLANNED = (
    "not by default with passes='auto': packed weights under the planner were measured on one "
    "model only (H200: hetero_towers training 1.20x Inductor at its peak memory); "
    "pack_parameters=True packs"
)


def packed_readers() -> list[str]:
    """The Torch-IR rules that read packed parameters in place (the rule trait
    ``reads_packed_parameters``: ``packed_linear``, the parameter-list ops)."""
    return [r.name for r in REGISTRY.rules("torch_ir") if r.reads_packed_parameters]


def pack_by_default(model: object, planned: bool, cudagraphs: bool, torch_ir_rules: Iterable[str] | None = None) -> tuple[bool, str]:
    """``optimus.compile(model)`` without ``pack_parameters=``: pack or not, and why.
    ``torch_ir_rules``: the Torch-IR rules the compile runs (default: every one); nothing
    packs when none of them reads packed parameters (``packed_readers``): nothing would read
    the buffers."""
    if not isinstance(model, nn.Module):
        return False, f"not by default: {type(model).__name__} is not an nn.Module"
    readers = packed_readers()
    if torch_ir_rules is not None and not set(readers) & set(torch_ir_rules):
        return False, f"not by default: none of the rules that read packed parameters runs ({', '.join(readers)})"
    if cudagraphs:
        return False, NOT_BY_DEFAULT_CUDAGRAPHS
    if planned:
        return False, NOT_BY_DEFAULT_PLANNED
    devices = sorted({p.device.type for p in model.parameters()})
    if devices != ["cuda"]:
        where = ", ".join(devices) or "no parameters"
        return False, f"not by default on {where}: packing was measured to pay on CUDA only"
    return True, "on by default (CUDA parameters, a fixed preset, no CUDA graphs; pack_parameters=False turns it off)"


def pack_for_compile(model: object) -> list[str]:
    """``optimus.compile(model, pack_parameters=True)``: pack ``model`` in place and return
    the report's notes (a note saying so when ``model`` is not an ``nn.Module``)."""
    if not isinstance(model, nn.Module):
        return [f"pack_parameters: {type(model).__name__} is not an nn.Module; nothing packed"]
    if isinstance(model, nn.parallel.DistributedDataParallel):
        return ["pack_parameters: the model is already wrapped in DistributedDataParallel; nothing packed "
                "(pack the module before wrapping it: optimus.pack_parameters(module))"]
    return pack_parameters(model).notes()
