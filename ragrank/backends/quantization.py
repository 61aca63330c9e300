"""The opt-in int8 CPU backend of both model roles, and the checks that gate it.

Dynamic int8 quantisation (per-channel weights, activations quantised per batch) of every
linear layer makes a BERT-sized model faster on CPU cores. It also moves its outputs, so a
quantised model is used only after it is compared with the float model on a calibration set
from the bundled sample: a cross-encoder by the per-query Spearman correlation of the two
score lists, an embedder by the cosine between each text's two vectors. Below the role's
`RAGRANK_*_MIN_AGREEMENT` the model is refused.
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import numpy as np
import torch
from scipy.stats import spearmanr
from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear

from ragrank import SAMPLE_DATASET
from ragrank.documents import open_text, read_jsonl_documents
from ragrank.errors import ModelLoadError
from ragrank.settings import env_name

if TYPE_CHECKING:
    from collections.abc import Callable, Collection, Sequence

    from numpy.typing import NDArray

    from ragrank.protocols import Pair


@dataclass(frozen=True)
class Agreement:
    """How closely a quantised scorer ranks like the float one."""

    queries: int
    pairs: int
    #: Mean and worst per-query Spearman correlation of the two score lists.
    mean_spearman: float
    min_spearman: float
    #: Share of queries whose best document is the same under both.
    top1: float
    #: Largest absolute difference of a logit.
    max_abs_diff: float

    @property
    def level(self) -> float:
        """What the threshold is compared with."""
        return self.mean_spearman

    def __str__(self) -> str:
        return (
            f"Spearman per query mean {self.mean_spearman:.3f} (min {self.min_spearman:.3f}), "
            f"same top-1 for {self.top1:.0%} of {self.queries} queries, "
            f"max |Δlogit| {self.max_abs_diff:.4f} over {self.pairs} pairs"
        )


@dataclass(frozen=True)
class VectorAgreement:
    """How closely a quantised embedder's vectors match the float one's."""

    texts: int
    #: Mean and worst cosine between a text's two vectors.
    mean_cosine: float
    min_cosine: float
    #: Share of calibration queries whose nearest passage is the same under both.
    top1: float

    @property
    def level(self) -> float:
        """What the threshold is compared with."""
        return self.mean_cosine

    def __str__(self) -> str:
        return (
            f"cosine to the float vectors mean {self.mean_cosine:.4f} (min "
            f"{self.min_cosine:.4f}) over {self.texts} texts, same nearest passage for "
            f"{self.top1:.0%} of queries"
        )


def calibration_texts(queries: int = 8, documents: int = 24) -> tuple[list[str], list[str]]:
    """(queries, passages) from the bundled sample, spread over the whole (multilingual)
    collection."""
    groups = calibration_groups(queries, documents)
    return [group[0][0] for group in groups], [passage for _, passage in groups[0]]


def vector_agreement(
    reference: tuple[NDArray[np.floating], NDArray[np.floating]],
    candidate: tuple[NDArray[np.floating], NDArray[np.floating]],
) -> VectorAgreement:
    """Compare two embedders' L2-normalised (query, passage) vectors of the same texts."""
    cosines = np.concatenate(
        [np.sum(r * c, axis=1) for r, c in zip(reference, candidate, strict=True)]
    )
    nearest = [
        np.argmax(queries @ passages.T, axis=1) for queries, passages in (reference, candidate)
    ]
    return VectorAgreement(
        texts=len(cosines),
        mean_cosine=float(np.mean(cosines)),
        min_cosine=float(np.min(cosines)),
        top1=float(np.mean(nearest[0] == nearest[1])),
    )


def calibration_groups(queries: int = 8, documents: int = 12) -> list[list[Pair]]:
    """(query, passage) pairs from the bundled sample: each query against the same documents,
    spread over the whole (multilingual) collection."""
    with open_text(SAMPLE_DATASET / "queries.jsonl") as lines:
        texts = [str(json.loads(line)["text"]) for line in islice(lines, queries)]
    corpus = list(read_jsonl_documents(SAMPLE_DATASET / "corpus.jsonl"))
    step = max(GATE_STRIDE, len(corpus) // documents // GATE_STRIDE * GATE_STRIDE)
    passages = [f"{d.title} {d.text}".strip() for d in corpus[::step][:documents]]
    return [[(query, passage) for passage in passages] for query in texts]


#: Every `GATE_STRIDE`-th passage of the sample, and its first `GATE_QUERIES` queries, are
#: the agreement gate's (`calibration_texts`, `calibration_groups`); static quantisation
#: calibrates on the rest (`held_out_texts`), so the gate measures texts it was not fit to.
GATE_STRIDE = 5
GATE_QUERIES = 8


def _sample() -> tuple[list[str], list[str]]:
    """(queries, passages) of the whole bundled sample."""
    with open_text(SAMPLE_DATASET / "queries.jsonl") as lines:
        queries = [str(json.loads(line)["text"]) for line in lines]
    corpus = read_jsonl_documents(SAMPLE_DATASET / "corpus.jsonl")
    return queries, [f"{d.title} {d.text}".strip() for d in corpus]


def held_out_texts() -> tuple[list[str], list[str]]:
    """(queries, passages) of the sample that no agreement gate reads: what static
    quantisation calibrates on."""
    queries, passages = _sample()
    return queries[GATE_QUERIES:], [p for i, p in enumerate(passages) if i % GATE_STRIDE]


def held_out_groups(documents: int = 12) -> list[list[Pair]]:
    """Each held-out query against `documents` held-out passages, a different slice each, so
    that the calibration pairs cover the whole multilingual sample."""
    queries, passages = held_out_texts()
    return [
        [(query, passages[(n * documents + k) % len(passages)]) for k in range(documents)]
        for n, query in enumerate(queries)
    ]


def require_floor(
    agreement: Measured, *, role: str, model_id: str, backend: str, floor: float
) -> None:
    """A `ModelLoadError` naming the role's settings when `agreement` is below `floor`."""
    prefix = ROLE_SETTINGS[role]
    setting, threshold = env_name(f"{prefix}_backend"), env_name(f"{prefix}_min_agreement")
    if agreement.level < floor:
        raise ModelLoadError(
            f"The {backend} {role} model {model_id!r} is too far from the float one "
            f"({agreement}); {threshold} is {floor:g}. Set {setting}=torch, or lower "
            f"{threshold} if that is acceptable."
        )


def rank_agreement(
    reference: Sequence[NDArray[np.floating]], candidate: Sequence[NDArray[np.floating]]
) -> Agreement:
    """Compare two scorers' logits, one array per query."""
    rhos = [float(spearmanr(r, c).statistic) for r, c in zip(reference, candidate, strict=True)]
    rhos = [0.0 if np.isnan(rho) else rho for rho in rhos]
    same_top = [
        int(np.argmax(r)) == int(np.argmax(c)) for r, c in zip(reference, candidate, strict=True)
    ]
    diffs = [
        float(np.max(np.abs(r - c))) for r, c in zip(reference, candidate, strict=True) if len(r)
    ]
    return Agreement(
        queries=len(rhos),
        pairs=sum(len(r) for r in reference),
        mean_spearman=float(np.mean(rhos)),
        min_spearman=float(np.min(rhos)),
        top1=float(np.mean(same_top)),
        max_abs_diff=max(diffs, default=0.0),
    )


#: Weights are quantised symmetrically per output channel to ±63, not ±127.
WEIGHT_LEVELS = 63


class FullRangeLinear(DynamicLinear):  # type: ignore[misc]  # untyped in torch
    """torch's dynamic int8 linear layer, with its activations quantised to all 8 bits.

    torch quantises a batch's activations to 7 bits (`reduce_range`), because x86's int8
    multiply-add (AVX2 `vpmaddubsw`) sums two u8-by-s8 products into a saturating int16:
    255·127·2 overflows it. With the weights at ±63 instead, 255·63·2 = 32,130 fits, and the
    bit moves to where the error is: one scale per tensor of activations (with outliers after
    GELU) against one per channel of weights. On multilingual-e5-small it takes the int8
    vectors' mean cosine to the float ones from 0.988 to 0.996, on all-MiniLM-L6-v2 from
    0.972 to 0.992 (docs/performance.md#int8-embedder).
    """

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y: torch.Tensor = torch.ops.quantized.linear_dynamic(
            x, self._packed_params._packed_params, reduce_range=False
        )
        return y.to(x.dtype)


#: What `quantize_int8` and `outlier_layers` make of an embedder, as its vectors' recipe
#: records it (the document stamp, the eval's cache key): a new recipe re-embeds.
INT8_RECIPE = "int8:w63-a8:float-outliers-5%"

#: The share of an embedder's linear layers kept in float: those whose inputs have the most
#: extreme outliers. On multilingual-e5-small that is 4 of 72 (the FFN down-projections of
#: layers 4, 0, 5 and 1): the vectors' mean cosine to the float ones rises from 0.996 to
#: 0.998, and those layers take about a tenth of the int8 forward's time at 256-token chunks
#: (docs/performance.md#int8-embedder).
FLOAT_SHARE = 0.05


def outlier_layers(
    model: torch.nn.Module, calibrate: Callable[[], object], share: float = FLOAT_SHARE
) -> list[str]:
    """Names of the `share` of `model`'s linear layers whose inputs peak furthest above their
    RMS while `calibrate()` runs it: an int8 batch has one activation scale, so one outlier
    coarsens every other value there."""
    peaks: dict[str, tuple[float, float]] = {}

    def record(name: str, _module: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> None:
        values = inputs[0].detach().float()
        peak, rms = float(values.abs().max()), float(values.pow(2).mean().sqrt())
        seen = peaks.get(name, (0.0, 0.0))
        peaks[name] = (max(seen[0], peak), max(seen[1], rms))

    hooks = [
        module.register_forward_pre_hook(partial(record, name))
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
    ]
    try:
        calibrate()
    finally:
        for hook in hooks:
            hook.remove()
    ratio = {name: peak / max(rms, 1e-12) for name, (peak, rms) in peaks.items()}
    count = max(1, round(share * len(ratio))) if share > 0 and ratio else 0
    return sorted(ratio, key=ratio.__getitem__, reverse=True)[:count]


def quantize_int8(
    model: torch.nn.Module, keep_float: Collection[str] = (), *, inplace: bool = False
) -> torch.nn.Module:
    """A copy of `model` (or `model` itself, `inplace`) whose linear layers, but those named in
    `keep_float`, run in int8 on the CPU (`FullRangeLinear`)."""
    from torch.ao.quantization import QConfig, per_channel_dynamic_qconfig, quantize_dynamic
    from torch.ao.quantization.observer import PerChannelMinMaxObserver

    qconfig = QConfig(
        activation=per_channel_dynamic_qconfig.activation,
        weight=PerChannelMinMaxObserver.with_args(
            dtype=torch.qint8,
            qscheme=torch.per_channel_symmetric,
            quant_min=-WEIGHT_LEVELS,
            quant_max=WEIGHT_LEVELS,
        ),
    )
    quantize: Any = quantize_dynamic  # untyped in torch
    with warnings.catch_warnings():
        # torch.ao's eager quantisation is deprecated in favour of torchao, which needs
        # torch.compile to be fast on CPUs; this path still works and needs nothing extra.
        warnings.simplefilter("ignore")
        quantized: torch.nn.Module = quantize(
            model,
            {
                name: qconfig
                for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) and name not in keep_float
            },
            mapping={torch.nn.Linear: FullRangeLinear},
            inplace=inplace,
        )
    return quantized


class Measured(Protocol):
    @property
    def level(self) -> float: ...


MeasuredT = TypeVar("MeasuredT", bound=Measured)

#: The settings prefix of each role's backend and agreement floor.
ROLE_SETTINGS = {"embedding": "embed", "reranking": "rerank"}


def require_cpu(role: str, device: str) -> None:
    """A `ModelLoadError` naming the role's backend setting when `device` is not the CPU."""
    backend = env_name(f"{ROLE_SETTINGS[role]}_backend")
    if device != "cpu":
        raise ModelLoadError(
            f"{backend}=int8 runs on the CPU only; set {backend}=torch on {device}"
        )


def checked_int8(
    model: torch.nn.Module,
    *,
    role: str,
    model_id: str,
    device: str,
    floor: float,
    compare: Callable[[torch.nn.Module], MeasuredT],
    keep_float: Collection[str] = (),
    inplace: bool = False,
) -> tuple[torch.nn.Module, MeasuredT]:
    """`model` quantised but for the layers in `keep_float`, with how it agrees with the float
    model (`compare` runs the calibration set through both, or through the quantised one only
    when `inplace` leaves no float model); a `ModelLoadError` naming the settings off the CPU,
    or when the agreement is below `floor`."""
    require_cpu(role, device)
    quantized = quantize_int8(model, keep_float, inplace=inplace)
    agreement = compare(quantized)
    require_floor(agreement, role=role, model_id=model_id, backend="int8", floor=floor)
    return quantized, agreement


def checked_agreement(
    groups: Sequence[Sequence[Pair]],
    float_scores: Callable[[Sequence[Pair]], NDArray[np.float32]],
    int8_scores: Callable[[Sequence[Pair]], NDArray[np.float32]],
) -> Agreement:
    """Score every calibration group with both scorers and compare the rankings."""
    reference = [float_scores(group) for group in groups]
    candidate = [int8_scores(group) for group in groups]
    return rank_agreement(reference, candidate)
