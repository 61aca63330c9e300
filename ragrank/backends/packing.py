"""Collating model inputs into tensors, padded or packed, and the padding-free forward.

Packed: a batch's sequences are concatenated into one row, with cumulative lengths and
per-sequence position ids, and attention runs over each sequence alone (varlen), causally for
decoder models and within the window of sliding-window layers. No compute is spent on padding,
so the token budget counts real tokens. It runs the Hugging Face model's own modules
(embeddings, layers, heads) for the BERT, XLM-R, ModernBERT and Qwen3 families; attention goes
through a function registered with transformers that also serves the padded path.

This module runs on host threads (collating) and the model's thread (forward); nothing here
is called from the event loop.
"""

from __future__ import annotations

import itertools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.tokens import ModelInput

log = logging.getLogger(__name__)

#: The attention implementation ragrank's models run with: varlen when a batch is packed,
#: transformers' SDPA otherwise.
ATTENTION = "ragrank_varlen"
#: Model types whose embeddings and layers the packed forward knows.
FAMILIES = ("bert", "xlm-roberta", "roberta", "modernbert", "qwen3")
#: Of those, the ones whose base model takes packed rows in its own `forward` (rotary
#: positions, a per-layer-type mask mapping), rather than embeddings and encoder called apart.
WHOLE_FORWARD = ("modernbert", "qwen3")
#: The types whose position ids count from padding_idx + 1 rather than 0.
PADDING_OFFSET_POSITIONS = ("xlm-roberta", "roberta")


def _flash_varlen() -> Any:
    try:
        from flash_attn import flash_attn_varlen_func
    except ImportError:
        return None
    return flash_attn_varlen_func


def resolve_varlen_backend(requested: str, device: str, dtype: torch.dtype) -> str:
    """`auto`: flash-attn where installed, else torch's varlen kernel on CUDA in half
    precision, else SDPA per sequence."""
    half = dtype in (torch.float16, torch.bfloat16)
    if requested != "auto":
        return requested
    if device.startswith("cuda") and half:
        return "flash-attn" if _flash_varlen() is not None else "torch"
    return "sdpa"


def _varlen_attention(  # noqa: PLR0917 (transformers' attention signature)
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Attention over [1, heads, tokens, dim] packed rows, each sequence attending to itself;
    without cumulative lengths (a padded batch), transformers' SDPA."""
    cu_seqlens = kwargs.pop("cu_seq_lens_q", None)
    if cu_seqlens is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        output: tuple[torch.Tensor, None] = sdpa_attention_forward(
            module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
        )
        return output
    backend = kwargs.get("ragrank_varlen", "sdpa")
    longest = int(kwargs["max_length_q"])
    causal = bool(getattr(module, "is_causal", False))
    # transformers passes a layer's window so that a token sees keys within `window - 1`
    # positions (ModernBERT's local layers both ways, a decoder's to the left).
    window = kwargs.get("sliding_window")
    left = int(window) - 1 if window else -1
    right = 0 if causal else left
    grouped = key.shape[1] != query.shape[1]
    if backend == "sdpa":
        bounds = kwargs["ragrank_bounds"]
        pieces = []
        for start, end in itertools.pairwise(bounds):
            mask = _window_mask(end - start, left, right, query.device) if window else None
            pieces.append(
                F.scaled_dot_product_attention(
                    query[:, :, start:end],
                    key[:, :, start:end],
                    value[:, :, start:end],
                    attn_mask=mask,
                    is_causal=causal and mask is None,
                    scale=scaling,
                    enable_gqa=grouped,
                )
            )
        return torch.cat(pieces, dim=2).transpose(1, 2).contiguous(), None
    # The varlen kernels take [tokens, heads, dim].
    q, k, v = (t[0].transpose(0, 1) for t in (query, key, value))
    if backend == "flash-attn":
        out = _flash_varlen()(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            longest,
            longest,
            softmax_scale=scaling,
            causal=causal,
            window_size=(left, right),
        )
    else:
        from torch.nn.attention.varlen import varlen_attn

        # torch 2.11's kernel has no `enable_gqa`: it is passed only for grouped heads.
        grouping = {"enable_gqa": True} if grouped else {}
        out = varlen_attn(
            q,
            k,
            v,
            cu_seqlens,
            cu_seqlens,
            longest,
            longest,
            scale=scaling,
            window_size=(left, right),
            **grouping,
        )
    return out.unsqueeze(0), None


def _window_mask(length: int, left: int, right: int, device: torch.device) -> torch.Tensor:
    """Which keys each query of one sequence sees: at most `left` before it and `right` after
    it (-1: unbounded)."""
    position = torch.arange(length, device=device)
    distance = position[None, :] - position[:, None]
    mask = torch.ones(length, length, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= distance >= -left
    if right >= 0:
        mask &= distance <= right
    return mask


def register_attention() -> None:
    """Make `ATTENTION` known to transformers (idempotent)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _varlen_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


@dataclass(frozen=True)
class PackedBatch:
    """Sequences concatenated into one row, on the host (pinned where the model is on CUDA)."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    token_type_ids: torch.Tensor | None
    cu_seqlens: torch.Tensor
    bounds: list[int]
    longest: int

    @property
    def count(self) -> int:
        return len(self.bounds) - 1


@dataclass(frozen=True)
class PaddedBatch:
    """Sequences padded to the longest, with an attention mask."""

    features: dict[str, torch.Tensor]


Batch = PackedBatch | PaddedBatch


def _host(array: np.ndarray[Any, Any], pin: bool) -> torch.Tensor:
    tensor = torch.from_numpy(array)
    return tensor.pin_memory() if pin else tensor


def collate_padded(
    inputs: Sequence[ModelInput], *, pad_id: int, uses_types: bool, pin: bool
) -> PaddedBatch:
    """Right-padded ids, mask and (where the model has them) token types."""
    longest = max(len(item) for item in inputs)
    ids = np.full((len(inputs), longest), pad_id, dtype=np.int64)
    mask = np.zeros((len(inputs), longest), dtype=np.int64)
    types = np.zeros((len(inputs), longest), dtype=np.int64) if uses_types else None
    for row, item in enumerate(inputs):
        ids[row, : len(item)] = item.ids
        mask[row, : len(item)] = 1
        if types is not None and item.type_ids is not None:
            types[row, : len(item)] = item.type_ids
    features = {"input_ids": _host(ids, pin), "attention_mask": _host(mask, pin)}
    if types is not None:
        features["token_type_ids"] = _host(types, pin)
    return PaddedBatch(features)


def collate_packed(
    inputs: Sequence[ModelInput], *, first_position: int, uses_types: bool, pin: bool
) -> PackedBatch:
    """One row of all ids, positions restarting at `first_position` for each sequence."""
    lengths = np.fromiter((len(item) for item in inputs), dtype=np.int64, count=len(inputs))
    bounds = np.zeros(len(inputs) + 1, dtype=np.int64)
    np.cumsum(lengths, out=bounds[1:])
    total = int(bounds[-1])
    ids = np.fromiter(
        itertools.chain.from_iterable(item.ids for item in inputs), dtype=np.int64, count=total
    )
    positions = np.arange(total, dtype=np.int64) - np.repeat(bounds[:-1], lengths)
    positions += first_position
    types = None
    if uses_types:
        types = np.fromiter(
            itertools.chain.from_iterable(
                item.type_ids if item.type_ids is not None else [0] * len(item) for item in inputs
            ),
            dtype=np.int64,
            count=total,
        )
    return PackedBatch(
        input_ids=_host(ids[None], pin),
        position_ids=_host(positions[None], pin),
        token_type_ids=None if types is None else _host(types[None], pin),
        cu_seqlens=_host(bounds.astype(np.int32), pin),
        bounds=bounds.tolist(),
        longest=int(lengths.max()),
    )


def packing_family(config: Any) -> str | None:
    """The model's family if the packed forward can run it, else None."""
    if getattr(config, "model_type", None) not in FAMILIES:
        return None
    if getattr(config, "position_embedding_type", "absolute") != "absolute":
        return None
    if getattr(config, "is_decoder", False):
        return None
    return str(config.model_type)


def first_position(config: Any) -> int:
    """The position id of a sequence's first token: padding_idx + 1 for XLM-R, else 0."""
    if config.model_type in PADDING_OFFSET_POSITIONS:
        return int(config.pad_token_id) + 1
    return 0


def packed_hidden(
    base: torch.nn.Module, batch: PackedBatch, device: str, varlen: str
) -> torch.Tensor:
    """Last hidden states [tokens, hidden] of a packed batch through `base`'s own modules."""

    def move(tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(device, non_blocking=True)

    cu_seqlens = move(batch.cu_seqlens)
    attention = {
        "cu_seq_lens_q": cu_seqlens,
        "cu_seq_lens_k": cu_seqlens,
        "max_length_q": batch.longest,
        "max_length_k": batch.longest,
        "ragrank_varlen": varlen,
        "ragrank_bounds": batch.bounds,
    }
    config: Any = base.config
    if config.model_type in WHOLE_FORWARD:
        # No mask: each layer type's attention reads the sequences' bounds instead, so no
        # tokens-by-tokens mask is ever built.
        layer_types: Any = getattr(config, "layer_types", None) or ["full_attention"]
        extra = {"use_cache": False} if config.model_type == "qwen3" else {}
        output: Any = base(
            input_ids=move(batch.input_ids),
            position_ids=move(batch.position_ids),
            attention_mask=dict.fromkeys(set(layer_types)),
            **extra,
            **attention,
        )
        whole: torch.Tensor = output.last_hidden_state[0]
        return whole
    embeddings: Any = base.embeddings
    encoder: Any = base.encoder
    hidden = embeddings(
        input_ids=move(batch.input_ids),
        position_ids=move(batch.position_ids),
        token_type_ids=None if batch.token_type_ids is None else move(batch.token_type_ids),
    )
    output = encoder(hidden, attention_mask=None, **attention)
    last: torch.Tensor = output.last_hidden_state[0]
    return last


def segment_mean(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """The mean of each sequence's rows."""
    lengths = torch.diff(batch.cu_seqlens.to(hidden.device, dtype=torch.long))
    owner = torch.repeat_interleave(torch.arange(batch.count, device=hidden.device), lengths)
    sums = torch.zeros(batch.count, hidden.shape[-1], device=hidden.device, dtype=torch.float32)
    sums.index_add_(0, owner, hidden.float())
    return sums / lengths.unsqueeze(1).float()


def first_rows(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Each sequence's first row (its CLS / <s> token)."""
    starts = batch.cu_seqlens[:-1].to(hidden.device, dtype=torch.long)
    return hidden.index_select(0, starts)


def last_rows(hidden: torch.Tensor, batch: PackedBatch) -> torch.Tensor:
    """Each sequence's last row: where a decoder has read the whole input."""
    ends = batch.cu_seqlens[1:].to(hidden.device, dtype=torch.long) - 1
    return hidden.index_select(0, ends)


def pooled_rows(hidden: torch.Tensor, batch: PackedBatch, pooling: str) -> torch.Tensor:
    """One row per sequence, in the hidden states' dtype: its `first` row, the `mean` of its
    rows, or its `last` row."""
    if pooling == "mean":
        return segment_mean(hidden, batch).to(hidden.dtype)
    return (last_rows if pooling == "last" else first_rows)(hidden, batch)
