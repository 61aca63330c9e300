"""The torch side that both model roles share: a transformers model fed ids assembled once
(`Tokens`), collated padded or packed, run under `inference_mode` with device errors turned into
the errors the batching engine acts on, its output queued for the host. A backend is what the
engine drives (collate, upload, launch, fetch); this is the torch one, and a compiled backend
(`ragrank.backends.openvino`) swaps in its own forward pass behind the same runner."""

from __future__ import annotations

import dataclasses
import logging
import threading
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np
import torch

from ragrank.backends.packing import (
    ATTENTION,
    Batch,
    PackedBatch,
    PaddedBatch,
    collate_packed,
    collate_padded,
    first_position,
    packing_family,
    register_attention,
    resolve_varlen_backend,
)
from ragrank.errors import BatchTooLargeError, ModelFailedError, ModelLoadError, SettingsError
from ragrank.settings import env_name
from ragrank.tokens import ModelInput, Tokens

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence

    from numpy.typing import NDArray

    from ragrank.device import Placement
    from ragrank.roles import Role

log = logging.getLogger(__name__)

#: One forward pass over a collated batch: its output on the device (vectors or logits).
Forward: TypeAlias = Callable[[Batch], torch.Tensor]


@contextmanager
def device_errors() -> Iterator[None]:
    """Translate CUDA failures into the errors the batching engine acts on."""
    try:
        yield
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        raise BatchTooLargeError("the device ran out of memory on this batch") from None
    except RuntimeError as exc:
        if "CUDA error" in str(exc):
            raise ModelFailedError(f"the model can no longer run: {exc}") from exc
        raise


def resolve_packed(setting: str, placement: Placement) -> bool:
    """`auto` packs on CUDA (padding-free, varlen attention) and pads on the CPU, where
    packing measured no faster (docs/performance.md)."""
    if setting not in ("auto", "on", "off"):
        raise SettingsError(f"{env_name('packed')} must be one of auto, on, off")
    if setting == "auto":
        return placement.device.startswith("cuda")
    return setting == "on"


@dataclass(frozen=True)
class Launched:
    """A forward pass's output on its way to the host (`fetch` waits for it)."""

    output: torch.Tensor
    #: Recorded after the copy was queued on CUDA; None where the output is already here.
    done: Any

    def host(self) -> NDArray[np.float32]:
        if self.done is not None:
            self.done.synchronize()
        return np.asarray(self.output.numpy(), dtype=np.float32)


class TorchRunner:
    """What both roles share: a transformers model fed ids through `Tokens`, collated padded
    or packed, run under `inference_mode` with device errors translated."""

    def __init__(
        self,
        model: Any,
        tokens: Tokens,
        placement: Placement,
        *,
        packed: str,
        varlen: str,
        role: Role,
        model_id: str,
        can_pack: bool = True,
    ) -> None:
        register_attention()
        try:
            model.set_attn_implementation(ATTENTION)
        except (ValueError, NotImplementedError, AttributeError):
            # A model without transformers' attention interface keeps its own attention.
            can_pack = False
        self.tokens = tokens
        self.device = placement.device
        self.config = model.config
        self.family = packing_family(model.config)
        wanted = resolve_packed(packed, placement)
        self.packed = wanted and can_pack and self.family is not None
        if wanted and not self.packed:
            log.warning(
                "%s model %r: no packed forward for its architecture (%s); using padded batches",
                role,
                model_id,
                getattr(model.config, "model_type", "unknown"),
            )
        self.varlen = resolve_varlen_backend(varlen, placement.device, placement.dtype)
        self._pin = placement.device.startswith("cuda")
        # One forward at a time: the API's engine and an in-process indexing worker may share it.
        self.lock = threading.Lock()

    def pad_only(self, backend: str) -> None:
        """Padded, length-sorted batches from now on: a compiled backend runs no packed
        forward (packing saves padding on a GPU; on a CPU it measured no faster)."""
        if self.packed:
            log.warning("%s runs padded batches; packing is for torch on a GPU", backend)
        self.packed = False

    def collate(self, inputs: Sequence[ModelInput], packed: bool | None = None) -> Batch:
        """Packed or padded as the model runs (`packed` overrides, for benchmarks)."""
        uses_types = self.tokens.template.uses_types
        if self.packed if packed is None else packed:
            return collate_packed(
                inputs,
                first_position=first_position(self.config),
                uses_types=uses_types,
                pin=self._pin,
            )
        return collate_padded(
            inputs, pad_id=self.tokens.pad_id, uses_types=uses_types, pin=self._pin
        )

    def features(self, batch: Batch) -> dict[str, torch.Tensor]:
        assert not isinstance(batch, PackedBatch)
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.features.items()}

    def upload(self, batch: Batch) -> Batch:
        """The batch's tensors queued for the device (from pinned memory on CUDA, so the copy
        overlaps the pass before); the forward then finds them there. A no-op on the CPU."""
        if not self._pin:
            return batch

        def move(tensor: torch.Tensor) -> torch.Tensor:
            return tensor.to(self.device, non_blocking=True)

        if isinstance(batch, PackedBatch):
            types = batch.token_type_ids
            return dataclasses.replace(
                batch,
                input_ids=move(batch.input_ids),
                position_ids=move(batch.position_ids),
                token_type_ids=None if types is None else move(types),
                cu_seqlens=move(batch.cu_seqlens),
            )
        return PaddedBatch({k: move(v) for k, v in batch.features.items()})

    @contextmanager
    def running(self) -> Iterator[None]:
        with device_errors(), self.lock, torch.inference_mode():
            yield

    def launched(self, output: torch.Tensor) -> Launched:
        """`output` on its way to the host: on CUDA an asynchronous copy into pinned memory and
        an event to wait for, so the next forward pass can be launched meanwhile."""
        if not self._pin:
            return Launched(output, None)
        host = torch.empty(output.shape, dtype=output.dtype, pin_memory=True)
        host.copy_(output, non_blocking=True)
        done = torch.cuda.Event()
        done.record()
        return Launched(host, done)

    def warm_shapes(
        self, batch_items: int, batch_tokens: int, longest: int
    ) -> list[tuple[int, int]]:
        """(items, tokens each) of the warm-up passes: on a GPU a ladder of lengths, each alone
        and as a full batch, so that kernels, cuBLAS and the allocator are ready for real
        traffic; on a CPU, which compiles nothing, two short inputs (a long one would cost a
        large model seconds of start-up for nothing)."""
        if not self._pin:
            return [(1, min(16, longest)), (1, min(128, longest))]
        lengths = sorted({min(n, longest) for n in (16, 64, 128, 256, 512, longest)})
        full = [(max(1, min(batch_items, batch_tokens // n)), n) for n in lengths]
        return [(1, n) for n in lengths] + full

    def warm_up(
        self,
        make: Callable[[int], ModelInput],
        forward: Callable[[Batch], object],
        shapes: Sequence[tuple[int, int]],
    ) -> int:
        """Run `forward` over each shape, on a GPU packed (where the model packs) and padded,
        on a CPU the way it runs; returns the passes run."""
        if not self._pin:
            paths = [self.packed]
        else:
            paths = [True, False] if self.family is not None else [False]
        passes = 0
        for count, length in shapes:
            inputs = [make(length)] * count
            for packed in paths:
                forward(self.collate(inputs, packed))
                passes += 1
        if self._pin:
            torch.cuda.synchronize()
        return passes


def model_tokens(
    tokenizer: Any, max_length: int, role: Role, model_id: str, **layout: Any
) -> Tokens:
    """The model's `Tokens` (`layout`: its pair prompt and token types), or a
    `ModelLoadError` naming the model and its setting."""
    setting = env_name(role.setting("model"))
    try:
        return Tokens(tokenizer, max_length, **layout)
    except ValueError as exc:
        raise ModelLoadError(
            f"The {role.label} model {model_id!r} cannot be served: {exc}. Set {setting} to a "
            f"model with a fast (tokenizer.json) tokenizer."
        ) from exc


def sorted_batches(lengths: Sequence[int], size: int) -> Iterator[list[int]]:
    """Indices in ascending length, `size` at a time: little padding for callers that batch
    a whole list themselves."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    for start in range(0, len(order), size):
        yield order[start : start + size]


class RunnerModel:
    """What the engine drives, for a model on the torch runner: `collate`, `upload`, `launch`
    and `fetch` (the engine's side of a backend), with the forward pass the model chose at
    load (`_forward`: torch's, or a compiled backend's)."""

    _runner: TorchRunner
    _forward: Forward

    def collate(self, inputs: Sequence[ModelInput], *, packed: bool | None = None) -> Batch:
        """Packed or padded as the model runs (`packed` overrides, for benchmarks)."""
        return self._runner.collate(inputs, packed)

    def upload(self, batch: Batch) -> Batch:
        """The batch on the model's device (model thread, before `launch`)."""
        return self._runner.upload(batch)

    def launch(self, batch: Any) -> Launched:
        """The forward pass, its output queued for the host (model thread)."""
        with self._runner.running():
            return self._runner.launched(self._forward(batch))

    def fetch(self, launched: Launched) -> NDArray[np.float32]:
        """The output of a launched pass, once on the host."""
        return launched.host()

    def forward(self, batch: Any) -> NDArray[np.float32]:
        """One forward pass, waited for."""
        return self.fetch(self.launch(batch))
