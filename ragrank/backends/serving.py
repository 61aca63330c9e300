"""Loading the served models from their specs into one `Inference`: what the composition root
(`cli/`) and the benchmarks that measure the whole path call."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.calibration import read_calibration
from ragrank.device import resolve_placement
from ragrank.inference import Inference, Served, model_specs
from ragrank.memory import ModelSize, available_bytes, check_fits, weights_bytes
from ragrank.roles import EMBEDDING

if TYPE_CHECKING:
    from collections.abc import Sequence

    from ragrank.inference import ModelSpec, ModelSpecs
    from ragrank.settings import Settings


def check_specs_fit(specs: Sequence[ModelSpec], settings: Settings) -> None:
    """Refuse, with the figures, a set of models whose weights do not fit their devices."""
    by_device: dict[tuple[str, str], list[ModelSize]] = defaultdict(list)
    for spec in specs:
        placement = resolve_placement(spec.device, spec.dtype)
        dtype = str(placement.dtype).removeprefix("torch.")
        size = ModelSize(spec.name, weights_bytes(spec.model, dtype))
        by_device[placement.device, dtype].append(size)
    for (device, dtype), sizes in by_device.items():
        check_fits(
            sizes,
            device=device,
            dtype=dtype,
            share=settings.model_memory_share,
            free=available_bytes(device),
        )


def load_model(spec: ModelSpec, settings: Settings) -> Any:
    """The model `spec` describes, loaded through its backend."""
    if spec.role is EMBEDDING:
        return SentenceTransformerEmbedder.from_spec(spec, settings)
    return CrossEncoderScorer.from_spec(spec, settings)


def load_inference(
    settings: Settings,
    specs: ModelSpecs | None = None,
    *,
    rerankers: bool = True,
    offline: bool = False,
) -> Inference:
    """Check that the served models fit their devices, then load them (the rerankers only if
    `rerankers`) into one `Inference`; `specs` default to the settings' (`model_specs`)."""
    specs = specs or model_specs(settings)
    chosen = specs.all if rerankers else specs.embedders
    check_specs_fit(chosen, settings)
    return Inference(
        [Served(spec, load_model(spec, settings)) for spec in specs.embedders],
        [
            Served(spec, load_model(spec, settings), read_calibration(spec.model))
            for spec in specs.rerankers
        ]
        if rerankers
        else [],
        settings,
        offline=offline,
    )
