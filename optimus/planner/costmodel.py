"""A cost model per device: what a kernel, a launch and a copy cost, calibrated once.

``DeviceProfile`` holds the handful of numbers the planner needs:

* ``launch_us``: host time to launch one kernel from Inductor's generated code (what a
  launch-bound graph pays per kernel); near zero under CUDA graphs, where a replay
  launches every kernel from the device;
* ``kernel_floor_us``: the shortest time one kernel occupies the device, launched or
  replayed (a tiny kernel still costs this much of the stream);
* ``bandwidth_gbps``: achieved device-memory bandwidth, bytes read plus written;
* ``matmul_tflops``: achieved matmul rate for ``small`` (one wave of tiles or less) and
  ``large`` problems, per dtype class (``fp32``, ``tf32``, ``half``);
* ``units``: the device's parallel units (SMs; CPU cores), which decide how many
  independent tiles run at once.

``probe(device)`` measures them in about a second and caches the result on disk
(``~/.cache/optimus/profile-*.json``, keyed by device name and torch version); when a
probe cannot run (no GPU of that kind, a failure), documented defaults are used and the
profile says so (``source``). ``kernel_us`` estimates one kernel from its bytes, FLOPs
and tiles; the horizontal rules compare the kernels a group replaces with the kernel and
copies that replace them.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import pathlib
import time
from typing import Any

import torch

from .. import torch_api

log = logging.getLogger("optimus")

DTYPE_CLASSES = ("fp32", "tf32", "half")


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    device: str
    launch_us: float
    kernel_floor_us: float
    bandwidth_gbps: float
    matmul_tflops: dict[str, dict[str, float]]  # dtype class -> {"small": r, "large": r}
    units: int
    source: str  # "measured ..." or "defaults: ..."

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DeviceProfile":
        fields = {f.name for f in dataclasses.fields(cls)}
        missing = fields - set(data)
        if missing:
            raise ValueError(f"profile lacks {sorted(missing)}")
        return cls(**{k: data[k] for k in fields})


# Documented defaults, used when no probe ran. GPU: the probe's own figures on an H200
# (torch 2.11; docs/planner.md, "The cost model", names the profile), rounded: 10 us per
# eager launch from Python, 0.9 us kernel floor under CUDA graphs, 3.9 TB/s copy,
# matmul TFLOP/s small (512x256 @ 256x256) / large (4096^3): fp32 8.7 / 49, TF32 12 / 375,
# bf16 22 / 678. CPU: a few-core x86 server running Inductor's C++ loops.
DEFAULTS: dict[str, DeviceProfile] = {
    "cuda": DeviceProfile(
        device="cuda (defaults)",
        launch_us=10.0,
        kernel_floor_us=0.9,
        bandwidth_gbps=3900.0,
        matmul_tflops={"fp32": {"small": 8.7, "large": 49.0}, "tf32": {"small": 12.0, "large": 375.0}, "half": {"small": 22.0, "large": 678.0}},
        units=132,
        source="defaults: no probe ran (an H200's measured profile, docs/planner.md)",
    ),
    "cpu": DeviceProfile(
        device="cpu (defaults)",
        launch_us=0.5,
        kernel_floor_us=0.5,
        bandwidth_gbps=20.0,
        matmul_tflops={"fp32": {"small": 0.05, "large": 0.2}, "tf32": {"small": 0.05, "large": 0.2}, "half": {"small": 0.02, "large": 0.1}},
        units=max(1, os.cpu_count() or 1),
        source="defaults: no probe ran (few-core CPU constants, docs/planner.md)",
    ),
}

_PROFILES: dict[str, DeviceProfile] = {}
PROFILE_ENV = "OPTIMUS_DEVICE_PROFILE"  # "defaults": never probe, use DEFAULTS (tests, reproducible plans)


def dtype_class(dtype: torch.dtype) -> str:
    if dtype in (torch.float16, torch.bfloat16):
        return "half"
    if dtype == torch.float32 and torch_api.cuda_matmul_allows_tf32():
        return "tf32"
    return "fp32"


def cache_dir() -> pathlib.Path:
    root = os.environ.get("OPTIMUS_CACHE_DIR") or os.path.join(os.path.expanduser("~"), ".cache", "optimus")
    return pathlib.Path(root)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        try:
            return torch.cuda.get_device_name(device)
        except Exception:  # pragma: no cover
            return "cuda"
    return f"{device.type}-{os.cpu_count()}cores"


def _cache_file(device: torch.device) -> pathlib.Path:
    name = "".join(c if c.isalnum() else "_" for c in f"{_device_name(device)}-{torch.__version__}")
    return cache_dir() / f"profile-{name}.json"


def profile(device: Any = None, *, probe_if_missing: bool = True) -> DeviceProfile:
    """The device's profile: in memory, else from the disk cache, else probed (and
    cached), else the documented defaults."""
    dev = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    key = f"{dev.type}:{_device_name(dev)}"
    if key in _PROFILES:
        return _PROFILES[key]
    if os.environ.get(PROFILE_ENV, "").strip().lower() == "defaults":  # reproducible plans: no probe
        base = DEFAULTS["cuda" if dev.type == "cuda" else "cpu"]
        return dataclasses.replace(base, source=f"defaults: {PROFILE_ENV}=defaults")
    path = _cache_file(dev)
    found: DeviceProfile | None = None
    if path.is_file():
        try:
            found = DeviceProfile.from_json(json.loads(path.read_text()))
        except Exception as e:  # a corrupt or stale file: ignored, never trusted
            log.warning("optimus: ignoring the device profile cache %s (%s)", path, e)
    if found is None and probe_if_missing:
        try:
            found = probe(dev)
        except Exception as e:
            log.warning("optimus: the device probe could not run on %s (%s); using defaults", dev, e)
            found = None
        if found is not None:
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(found.to_json(), indent=1))
                tmp.replace(path)
            except OSError as e:  # pragma: no cover - read-only home
                log.warning("optimus: could not cache the device profile (%s)", e)
    if found is None:
        base = DEFAULTS["cuda" if dev.type == "cuda" else "cpu"]
        found = dataclasses.replace(base, device=f"{_device_name(dev)} (defaults)")
    _PROFILES[key] = found
    return found


def set_profile(device: Any, value: DeviceProfile) -> None:
    """Use ``value`` for ``device`` in this process (tests, or a profile from elsewhere)."""
    dev = torch.device(device)
    _PROFILES[f"{dev.type}:{_device_name(dev)}"] = value


# ------------------------------------------------------------------------ estimates
# The probe's small matmul (512 x 256 @ 256 x 256): 8 tiles of 128 x 128.
PROBE_SMALL = (512, 256, 256)


def matmul_rate(p: DeviceProfile, dtype: str, tiles: int | None) -> float:
    """Achieved TFLOP/s of a matmul of ``tiles`` 128x128 output tiles.

    Throughput follows occupancy: a problem of less than one wave fills ``tiles / units``
    of the device. Libraries tile small problems finer than 128x128; the measured
    small-problem rate calibrates by how much (``alpha``). A problem of a wave or more
    runs at the large rate: the partial last wave is not charged, because libraries
    balance it (split-K, stream-K, another tile) in ways the model cannot see; priced as
    lost, it made one bmm of large GEMMs look faster than its members. Batching pays for
    occupancy only where the members leave the device partly idle (``matmul_tiles``
    counts a long reduction's splits)."""
    r = p.matmul_tflops.get(dtype, p.matmul_tflops["fp32"])
    large, small = r["large"], r["small"]
    if tiles is None:
        return large
    probe_tiles = matmul_tiles(PROBE_SMALL[0], PROBE_SMALL[2])
    alpha = max(1.0, (small / large) / (probe_tiles / p.units))
    eff = alpha * max(1, tiles)
    return large * min(1.0, eff / p.units)


def kernel_us(p: DeviceProfile, bytes_moved: float, flops: float = 0.0, dtype: str = "fp32", tiles: int | None = None, launched: bool = True) -> float:
    """One kernel's device time: the larger of its memory time and its arithmetic time
    (at the rate its ``tiles`` achieve, see ``matmul_rate``), never under the kernel
    floor; when ``launched`` (not under CUDA graphs), a launch-bound stream pays at
    least the host launch."""
    mem = bytes_moved / (p.bandwidth_gbps * 1e3)  # GB/s -> bytes per us
    compute = flops / (matmul_rate(p, dtype, tiles) * 1e6) if flops else 0.0  # TFLOP/s -> flops per us
    t = max(p.kernel_floor_us, mem, compute)
    if launched:
        t = max(t, p.launch_us)
    return t


# A single matmul (not batched) whose reduction is this long or longer is assumed split
# along it (split-K) when its output tiles leave the device partly idle: ``k // SPLIT_K_DEPTH``
# parallel pieces per tile. Batched matmuls get no such split: cuBLAS's batched kernels
# reduce each product in one block (on the H200 a batched weight gradient over 262144 tokens
# ran 35.7 ms in a 32x32-tile kernel; docs/planner.md). Without this and the full-wave rule
# of ``matmul_rate``, HF BERT-base's weight gradients over 4096 tokens would be priced at 77%
# of the large rate alone and 88% (768 x 768, eight at a time) to 95% (768 x 3072, four)
# batched, so the planner would batch them (CPU proxy priced for the H200: four groups, e.g.
# 1988 -> 1744 us estimated for four FFN weight gradients, and a higher peak).
SPLIT_K_DEPTH = 1024


def matmul_tiles(m: int, n: int, batch: int = 1, tile: int = 128, k: int | None = None) -> int:
    """Output tiles of a (batched) ``m x n`` product; with ``k``, a single product's
    tiles count once per ``SPLIT_K_DEPTH`` of its reduction (see above)."""
    tiles = batch * math.ceil(max(m, 1) / tile) * math.ceil(max(n, 1) / tile)
    if batch == 1 and k is not None:
        tiles *= max(1, k // SPLIT_K_DEPTH)
    return tiles


def copy_us(p: DeviceProfile, nbytes: float, launched: bool = True) -> float:
    """A copy of ``nbytes`` (read once, written once) as its own kernel."""
    return kernel_us(p, 2.0 * nbytes, launched=launched)


# ------------------------------------------------------------------------ the probe
def probe(device: torch.device, repeats: int = 20) -> DeviceProfile:
    """Measure the profile on ``device`` (about a second on a GPU)."""
    if device.type == "cuda":
        return _probe_cuda(device, repeats)
    return _probe_cpu(repeats)


def _time_cuda(fn: Any, repeats: int, inner: int = 1) -> float:
    """Median microseconds of one ``fn`` on the current stream (CUDA events around
    ``inner`` back-to-back calls, so a short kernel is not timed with the host's gaps)."""
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(inner):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1e3 / inner)
    times.sort()
    return times[len(times) // 2]


_CAPTURE_STREAMS: dict[int, Any] = {}


def _capture_stream() -> Any:
    """One side stream per device for every probe capture (warm-up and capture both run
    on it). cuBLAS keeps workspaces per stream it ran on for the life of the process, so
    a fresh stream per probe matmul would leave 128 MiB allocated on an H200 (in every later
    row of a benchmark worker that probed); with one stream, 64 MiB."""
    dev = torch.cuda.current_device()
    if dev not in _CAPTURE_STREAMS:
        _CAPTURE_STREAMS[dev] = torch.cuda.Stream()
    return _CAPTURE_STREAMS[dev]


def _graph_us(fn: Any, n: int) -> float:
    """Device microseconds of one ``fn``: ``n`` calls captured in a CUDA graph, replayed."""
    s = _capture_stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for _ in range(n):
            fn()
    us = _time_cuda(g.replay, 5) / n
    del g  # its pool (the captured outputs) goes back now
    return us


def _probe_cuda(device: torch.device, repeats: int) -> DeviceProfile:
    torch.cuda.init()
    with torch.cuda.device(device):
        tiny = torch.zeros(1, device=device)
        n = 200

        def launches() -> None:
            for _ in range(n):
                tiny.add_(1.0)

        # host-bound: n tiny kernels launched back to back from Python (eager's dispatch
        # path; Inductor's generated launches cost about as much or a little less)
        launches()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        launches()
        torch.cuda.synchronize()
        launch_us = (time.perf_counter() - t0) * 1e6 / n
        # device-bound: the same kernels replayed from a CUDA graph
        floor_us = _graph_us(lambda: tiny.add_(1.0), n)
        big = torch.empty(256 * 2**20 // 4, device=device)
        out = torch.empty_like(big)
        copy = _time_cuda(lambda: out.copy_(big), repeats)
        bandwidth = 2 * big.numel() * 4 / copy / 1e3  # bytes per us -> GB/s
        rates: dict[str, dict[str, float]] = {}
        for cls, dtype, allow in (("fp32", torch.float32, False), ("tf32", torch.float32, True), ("half", torch.bfloat16, False)):
            with torch_api.tf32(allow):
                rates[cls] = {}
                for label, size in (("small", (512, 256, 256)), ("large", (4096, 4096, 4096))):
                    m, k, nn = size
                    a = torch.randn(m, k, device=device, dtype=dtype)
                    b = torch.randn(k, nn, device=device, dtype=dtype)
                    # small problems: a CUDA graph of 20 products, so launches do not count
                    t = _graph_us(lambda: a @ b, 20) if label == "small" else _time_cuda(lambda: a @ b, repeats)
                    rates[cls][label] = 2.0 * m * k * nn / t / 1e6
        units = torch.cuda.get_device_properties(device).multi_processor_count
    return DeviceProfile(
        device=_device_name(device),
        launch_us=round(launch_us, 3),
        kernel_floor_us=round(floor_us, 3),
        bandwidth_gbps=round(bandwidth, 1),
        matmul_tflops={k: {kk: round(vv, 2) for kk, vv in v.items()} for k, v in rates.items()},
        units=units,
        source=f"measured {time.strftime('%Y-%m-%d %H:%M')} (torch {torch.__version__})",
    )


def _probe_cpu(repeats: int) -> DeviceProfile:
    def med(fn: Any) -> float:
        fn()
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            fn()
            ts.append((time.perf_counter() - t0) * 1e6)
        ts.sort()
        return ts[len(ts) // 2]

    big = torch.empty(16 * 2**20 // 4)
    out = torch.empty_like(big)
    bandwidth = 2 * big.numel() * 4 / med(lambda: out.copy_(big)) / 1e3
    tiny = torch.zeros(1)
    launch_us = med(lambda: tiny.add_(1.0))
    rates: dict[str, dict[str, float]] = {}
    for label, (m, k, n) in (("small", (128, 128, 128)), ("large", (512, 512, 512))):
        a, b = torch.randn(m, k), torch.randn(k, n)
        rates.setdefault("fp32", {})[label] = 2.0 * m * k * n / med(lambda: a @ b) / 1e6
    rates["tf32"] = dict(rates["fp32"])
    rates["half"] = {k: v / 4 for k, v in rates["fp32"].items()}
    return DeviceProfile(
        device=_device_name(torch.device("cpu")),
        launch_us=round(launch_us, 3),
        kernel_floor_us=round(launch_us, 3),
        bandwidth_gbps=round(bandwidth, 2),
        matmul_tflops={k: {kk: round(vv, 4) for kk, vv in v.items()} for k, v in rates.items()},
        units=max(1, torch.get_num_threads()),
        source=f"measured {time.strftime('%Y-%m-%d %H:%M')} (torch {torch.__version__})",
    )
