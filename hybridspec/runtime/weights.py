"""Checkpoint weights streamed into a model built on the meta device.

Loading at scale (a 35B target is 70 GB in bf16): the model is built on the meta device (no memory,
no initialisation), checked against the checkpoint's safetensors headers (every name, shape and
coverage, before any weight is read), checked against the device's free memory, allocated once on
the target device in the target dtype, and filled tensor by tensor. Each tensor is read with plain
file reads into one reusable host buffer of `CHUNK_BYTES` and copied to the device, so the host
holds one chunk at a time. (safetensors' `safe_open` memory-maps the file instead; the pages it
touches count in the process's resident memory until the file is closed, a whole shard.)
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from .config import ConfigError
from .models.common import Placement

CHUNK_BYTES = 64 << 20  # the host buffer a tensor is read through, in rows of at most this many bytes
GIB = 1 << 30
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}
Route = Callable[[str], list[Placement]]


@dataclass(frozen=True, slots=True)
class StoredTensor:
    """One tensor of a safetensors file, from its header: bytes [start, end) of `file`."""

    file: Path
    name: str
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def checkpoint_files(directory: Path, source: str) -> list[Path]:
    """The shards listed by `model.safetensors.index.json`, else every `*.safetensors` file."""
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        missing = [n for n in names if not (directory / n).is_file()]
        if missing:
            raise ConfigError(f"{source}: {index.name} lists {len(missing)} shard(s) that are not there: "
                              f"{', '.join(missing[:4])}{' …' if len(missing) > 4 else ''}")
        return [directory / n for n in names]
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ConfigError(f"{source}: no *.safetensors files")
    return files


def read_header(file: Path) -> list[StoredTensor]:
    """The tensors of a safetensors file (8-byte little-endian header length, JSON header, data)."""
    size = file.stat().st_size
    with file.open("rb") as f:
        head = f.read(8)
        (length,) = struct.unpack("<Q", head) if len(head) == 8 else (size,)
        if length > size - 8:
            raise ConfigError(f"{file}: not a safetensors file ({size} bytes; a Git LFS pointer or a partial "
                              "download?)")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    base, tensors = 8 + length, []
    for name, info in header.items():
        if info["dtype"] not in SAFETENSORS_DTYPES:
            raise ConfigError(f"{file}: {name} has dtype {info['dtype']}, which the runtime does not read")
        start, end = info["data_offsets"]
        tensors.append(StoredTensor(file, name, SAFETENSORS_DTYPES[info["dtype"]], tuple(info["shape"]),
                                    base + start, base + end))
    if tensors and max(t.end for t in tensors) > size:
        raise ConfigError(f"{file}: truncated ({size} bytes, the header describes {max(t.end for t in tensors)})")
    return sorted(tensors, key=lambda t: t.start)


def read_checkpoint(directory: Path, source: str) -> list[StoredTensor]:
    return [t for file in checkpoint_files(directory, source) for t in read_header(file)]


Plan = list[tuple[StoredTensor, list[Placement]]]


def plan_load(model: nn.Module, tensors: list[StoredTensor], route: Route, source: str,
              optional: tuple[str, ...] = ()) -> Plan:
    """Every stored tensor's places in `model` (on the meta device), checked before any weight is read:
    no name without a parameter, every shape equal, every parameter but `optional` filled."""
    params = dict(model.named_parameters())
    filled: dict[str, int] = defaultdict(int)
    plan, unexpected = [], []
    for tensor in tensors:
        places = route(tensor.name)
        for place in places:
            if place.param not in params:
                unexpected.append(tensor.name)
                continue
            stored = torch.empty(tensor.shape, dtype=tensor.dtype, device="meta")
            stored = place.transform(stored) if place.transform else stored
            target = params[place.param].detach()[place.index]
            if tuple(target.shape) != tuple(stored.shape):
                raise ConfigError(f"{source}: {tensor.name} has shape {tuple(stored.shape)}, "
                                  f"config implies {tuple(target.shape)}")
            filled[place.param] += target.numel()
        if places:
            plan.append((tensor, places))
    missing = [n for n, p in params.items() if filled[n] < p.numel() and n not in optional]
    if missing or unexpected:
        raise ConfigError(f"{source}: weights do not match the config: missing {missing[:6]}"
                          f"{f' (+{len(missing) - 6})' if len(missing) > 6 else ''}, unexpected {unexpected[:6]}")
    return plan


def weight_bytes(model: nn.Module, dtype: torch.dtype) -> int:
    """Bytes of the model's parameters (tied ones once) in `dtype`."""
    return sum(p.numel() for p in model.parameters()) * dtype.itemsize


def device_memory(device: torch.device) -> tuple[int, int] | None:
    """(free, total) bytes of `device`: CUDA's free memory, or the host's available memory."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)
    if device.type == "cpu" and Path("/proc/meminfo").is_file():
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        kib = lambda key: int(info[key].split()[0]) * 1024  # noqa: E731
        return kib("MemAvailable"), kib("MemTotal")
    return None


def check_memory(needed: int, device: torch.device, what: str) -> None:
    """Refuse, before allocating, a model whose weights alone do not fit the device's free memory."""
    memory = device_memory(device)
    if memory is not None and needed > memory[0]:
        free, total = memory
        raise ConfigError(f"{what} needs {needed / GIB:.1f} GiB for its weights on {device}, which has "
                          f"{free / GIB:.1f} GiB free of {total / GIB:.1f} GiB; use a device with more memory, "
                          "--dtype bfloat16, or a smaller model")


def materialize_(model: nn.Module, device: torch.device, dtype: torch.dtype) -> nn.Module:
    """Give every meta parameter uninitialised storage on `device` in `dtype` (tied parameters stay
    tied); buffers are left to the caller."""
    made: dict[int, nn.Parameter] = {}
    for module in model.modules():
        for name, p in module._parameters.items():
            if p is None:
                continue
            if id(p) not in made:
                made[id(p)] = nn.Parameter(torch.empty(p.shape, device=device, dtype=dtype),
                                           requires_grad=p.requires_grad)
            module._parameters[name] = made[id(p)]
    return model


class ChunkReader:
    """Reads stored tensors through one reusable host buffer (pinned when copying to CUDA)."""

    def __init__(self, device: torch.device):
        self.pin = device.type == "cuda"
        self.buffer = torch.empty(CHUNK_BYTES, dtype=torch.uint8, pin_memory=self.pin)
        self.file, self.handle = None, None

    def _read(self, tensor: StoredTensor, offset: int, nbytes: int) -> Tensor:
        if self.file != tensor.file:
            self.close()
            self.file, self.handle = tensor.file, tensor.file.open("rb", buffering=0)
        if nbytes > self.buffer.numel():
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, pin_memory=self.pin)
        view = memoryview(self.buffer.numpy())[:nbytes]
        done = 0
        while done < nbytes:
            n = os.preadv(self.handle.fileno(), [view[done:]], tensor.start + offset + done)
            if n == 0:
                raise ConfigError(f"{tensor.file}: ends inside {tensor.name}")
            done += n
        return self.buffer[:nbytes]

    def rows(self, tensor: StoredTensor):
        """(first row, rows [n, …] in the stored dtype) chunks of `tensor` along its first dimension."""
        shape = tensor.shape or (1,)
        row_bytes = math.prod(shape[1:]) * tensor.dtype.itemsize
        step = max(1, self.buffer.numel() // max(row_bytes, 1))
        for first in range(0, shape[0], step):
            n = min(step, shape[0] - first)
            raw = self._read(tensor, first * row_bytes, n * row_bytes)
            yield first, raw.view(tensor.dtype).view(n, *shape[1:])

    def whole(self, tensor: StoredTensor) -> Tensor:
        """The whole tensor in a fresh host tensor (for transforms that need all of it)."""
        raw = self._read(tensor, 0, tensor.end - tensor.start)
        return raw.view(tensor.dtype).view(tensor.shape).clone()

    def close(self) -> None:
        if self.handle is not None:
            self.handle.close()
        self.file, self.handle = None, None


@torch.no_grad()
def stream_(model: nn.Module, plan: Plan, device: torch.device) -> None:
    """Copy every planned tensor into its places in `model` (materialised on `device`)."""
    params = dict(model.named_parameters())
    reader = ChunkReader(device)
    try:
        for tensor, places in plan:
            if any(p.transform for p in places) or not tensor.shape:
                whole = reader.whole(tensor)
                for p in places:
                    params[p.param][p.index].copy_(p.transform(whole) if p.transform else whole.view(tensor.shape))
                continue
            targets = [params[p.param][p.index] for p in places]
            for first, rows in reader.rows(tensor):
                for target in targets:
                    target[first:first + rows.shape[0]].copy_(rows)
    finally:
        reader.close()


@torch.no_grad()
def stream_parts_(model: nn.Module, plan: Plan, full_shapes: dict[str, torch.Size],
                  part: Callable[[str, Tensor], Tensor]) -> None:
    """Fill `model`, one rank's part of a model, from a plan made against the full model's shapes
    (`full_shapes`): each full parameter is assembled on the host in the model's dtype, handed to
    `part(name, full)` once every element of it has arrived, and only the part is copied to the
    model's device. The host holds the parameters being assembled, not the model."""
    params = dict(model.named_parameters())
    dtype = next(iter(params.values())).dtype
    staged: dict[str, Tensor] = {}
    filled: dict[str, int] = defaultdict(int)
    reader = ChunkReader(torch.device("cpu"))
    try:
        for tensor, places in plan:
            whole = reader.whole(tensor)
            for p in places:
                if p.param not in staged:
                    staged[p.param] = torch.empty(full_shapes[p.param], dtype=dtype)
                target = staged[p.param][p.index]
                target.copy_(p.transform(whole) if p.transform else whole)
                filled[p.param] += target.numel()
                if filled[p.param] == staged[p.param].numel():
                    params[p.param].copy_(part(p.param, staged.pop(p.param)))
    finally:
        reader.close()
