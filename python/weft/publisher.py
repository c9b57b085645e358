"""Publishing policy versions from a trainer's state dict (weft.Publisher)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Iterable, List, Mapping, Optional, Tuple, Union

from . import _weft
from .errors import InvalidArgument

SERVING_FORMATS = ("bf16", "fp16", "fp8-e4m3", "fp8-e5m2")

Tensors = Union[Mapping[str, Any], Iterable[Tuple[str, Any]]]


@dataclasses.dataclass(frozen=True)
class PublishResult:
    """What one ``start`` or ``publish`` did."""

    version: int
    bytes_written: int  # blobs this rank wrote: delta, keyframe and skip deltas
    density: float  # changed served elements / all served elements (1.0 for version 0)
    changed_elements: int
    elements: int  # served elements of this publisher's tensors (FP8 scales included)
    seconds: float  # conversion, encoding and upload
    keyframe: bool  # the version has a keyframe
    keyframe_bytes: int
    delta_bytes: int
    served_bytes: int  # one full checkpoint of this publisher's tensors in the serving format


def _capsules(state_dict: Tensors) -> List[Tuple[str, Any]]:
    """(name, DLPack capsule) for every tensor, without copying any of them."""
    items = state_dict.items() if hasattr(state_dict, "items") else state_dict
    out = []
    for name, tensor in items:
        if not isinstance(name, str):
            raise InvalidArgument(f"tensor names must be strings, not {type(name).__name__}")
        if hasattr(tensor, "detach"):
            tensor = tensor.detach()  # the same storage, without autograd
        if hasattr(tensor, "is_contiguous") and not tensor.is_contiguous():
            raise InvalidArgument(
                f"tensor '{name}' is not contiguous; publish tensor.contiguous() (a copy) or a "
                "contiguous view")
        if not hasattr(tensor, "__dlpack__"):
            raise InvalidArgument(
                f"tensor '{name}' is a {type(tensor).__name__}, which does not export DLPack; "
                "pass torch tensors or numpy arrays")
        try:
            capsule = tensor.__dlpack__()
        except (RuntimeError, BufferError, TypeError, ValueError) as error:
            raise InvalidArgument(f"tensor '{name}' cannot be read through DLPack: {error}") from None
        out.append((name, capsule))
    if not out:
        raise InvalidArgument("the state dict holds no tensors")
    return out


class Publisher:
    """Publishes a run's versions to a policy store, as deltas in the serving format.

    ``store`` is a directory, ``file://PATH`` or ``http(s)://HOST:PORT`` (a ``weft store serve``
    server; ``token`` is its writer token, default the ``WEFT_STORE_TOKEN`` environment variable).
    ``serving`` is the engine's number format; ``block`` the FP8 scale tile (``None``: 128 for
    FP8; 0: one scale per tensor). Version 0 is written whole (a keyframe), every later version as
    a delta against the previous one, with a keyframe every ``keyframe_interval`` versions or
    when the deltas since the last keyframe outgrow ``keyframe_budget`` times its size.
    ``delta_mode`` is ``"plain"`` or ``"context"``: context-coded deltas place each change by the
    exponent of the weight it changes, which makes them about a fifth smaller on optimiser steps
    for more encoding and applying work (a single publishing rank only; docs/formats.md).

    Sharded trainers create one publisher per rank (``rank``, ``world``), each over the tensors
    that rank holds; every rank calls ``start`` and then ``publish`` in step, rank 0 merges the
    parts into the version, and every call returns once the version is visible.

    The master weights (float32 or bfloat16 CPU tensors, contiguous and aligned) are read in
    place, never copied: until a call returns, do not modify, resize or free them (nor leave an
    FSDP ``summon_full_params`` context that provides them). Calls release the GIL. One publisher
    per run (per rank); calls from several threads are serialised.
    """

    def __init__(self, store: str, run: str, serving: str = "bf16", block: Optional[int] = None,
                 rank: int = 0, world: int = 1, keyframe_interval: int = 50,
                 keyframe_budget: Optional[float] = None, token: Optional[str] = None,
                 threads: int = 1, shard_deadline: float = 600.0, delta_mode: str = "plain"):
        if serving not in SERVING_FORMATS:
            raise InvalidArgument(
                f"serving format '{serving}' is not one of {', '.join(SERVING_FORMATS)}")
        if delta_mode not in ("plain", "context"):
            raise InvalidArgument(f"delta_mode must be 'plain' or 'context', not {delta_mode!r}")
        if block is None:
            block = 128
        if not isinstance(block, int) or block < 0 or block > 1 << 20:
            raise InvalidArgument(f"block must be an integer from 0 to 2^20, not {block!r}")
        for what, value in (("rank", rank), ("world", world),
                            ("keyframe_interval", keyframe_interval), ("threads", threads)):
            if not isinstance(value, int) or value < 0:
                raise InvalidArgument(f"{what} must be a non-negative integer, not {value!r}")
        if not isinstance(store, (str, os.PathLike)) or not isinstance(os.fspath(store), str):
            raise InvalidArgument(
                f"store must be a directory path or a store URI (str or os.PathLike), not "
                f"{type(store).__name__}")
        self._native = _weft.Publisher(
            store=os.fspath(store), run=run, serving=serving, block=block, rank=rank, world=world,
            keyframe_interval=keyframe_interval,
            keyframe_budget=0.0 if keyframe_budget is None else float(keyframe_budget),
            token=token, threads=threads, shard_deadline=float(shard_deadline),
            delta_mode=delta_mode)

    def start(self, state_dict: Tensors) -> PublishResult:
        """Starts the run (which must not exist yet) with ``state_dict`` as version 0."""
        return PublishResult(**self._native.start(_capsules(state_dict)))

    def publish(self, state_dict: Tensors) -> PublishResult:
        """Publishes the next version: the same tensor names and shapes as ``start`` had."""
        return PublishResult(**self._native.publish(_capsules(state_dict)))

    @property
    def version(self) -> Optional[int]:
        """The last version published (``None`` before ``start``)."""
        return self._native.version

    def __repr__(self) -> str:
        return f"weft.Publisher({self._native.store}, version={self.version})"


def inspect_tensors(state_dict: Tensors) -> List[Tuple[str, str, int, List[int]]]:
    """(name, dtype, address, shape) of the memory a publisher reads for each tensor."""
    return _weft.inspect_tensors(_capsules(state_dict))
