"""The embedding role's model: a sentence-transformers bi-encoder with role prefixes and
normalised output, on the torch runner, or compiled by OpenVINO behind the same runner."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from ragrank.backends.agreement import (
    VectorAgreement,
    calibration_texts,
    held_out_texts,
    vector_agreement,
)
from ragrank.backends.openvino import (
    RECIPES,
    Calibration,
    CompileJob,
    Conversion,
    Traced,
    calibration_batches,
    compile_and_gate,
    is_openvino,
    resolve_backend,
    traced_example,
)
from ragrank.backends.packing import PackedBatch, first_rows, packed_hidden, segment_mean
from ragrank.backends.torch_runner import (
    Forward,
    RunnerModel,
    TorchRunner,
    model_tokens,
    sorted_batches,
)
from ragrank.device import Placement, batch_limits, bound_kernel_cache, resolve_placement
from ragrank.errors import ModelLoadError
from ragrank.inference.spec import ModelSpec, role_spec
from ragrank.loading import load_model
from ragrank.roles import EMBEDDING
from ragrank.settings import OPENVINO_CACHE, Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from ragrank.backends.packing import Batch
    from ragrank.protocols import Vectors
    from ragrank.tokens import ModelInput, TokenSpans

log = logging.getLogger(__name__)


class SentenceTransformerEmbedder(RunnerModel):
    """A sentence-transformers bi-encoder with role prefixes and normalised output."""

    def __init__(
        self,
        model_id: str,
        *,
        query_prefix: str,
        passage_prefix: str,
        placement: Placement,
        batch_size: int = 32,
        packed: str = "off",
        varlen: str = "auto",
        backend: str = "torch",
        min_agreement: float = 0.99,
        openvino_cache: Path = OPENVINO_CACHE,
    ) -> None:
        from sentence_transformers import SentenceTransformer

        def loader(source: str) -> SentenceTransformer:
            return SentenceTransformer(
                source, device=placement.device, model_kwargs={"dtype": placement.dtype}
            )

        self._model = load_model(
            EMBEDDING.label, model_id, env_name(EMBEDDING.setting("model")), loader
        )
        self._model.eval()
        self.model_id = model_id
        dimension = self._model.get_embedding_dimension()
        if dimension is None:
            raise ModelLoadError(f"The embedding model {model_id!r} reports no dimension")
        self.dimension: int = int(dimension)
        limit = self._model.max_seq_length
        if limit is None:
            limit = int(getattr(self._model.tokenizer, "model_max_length", 512))
        self.max_length: int = min(int(limit), 100_000)
        self.query_prefix = query_prefix
        self.passage_prefix = passage_prefix
        self._batch_size = batch_size
        self.tokens = model_tokens(self._model.tokenizer, self.max_length, EMBEDDING, model_id)
        modules: list[Any] = list(self._model)
        self._pooling = _packable_pooling(modules)
        self._encoder: torch.nn.Module = modules[0].auto_model
        self._runner = TorchRunner(
            self._encoder,
            self.tokens,
            placement,
            packed=packed,
            varlen=varlen,
            role=EMBEDDING,
            model_id=model_id,
            can_pack=self._pooling is not None,
        )
        self.packed = self._runner.packed
        #: `torch`, or the backend's recipe: part of the vectors' stamp and the eval's cache key.
        self.backend = "torch"
        #: How the backend's vectors match torch's float32 ones; None on the torch backend.
        self.agreement: VectorAgreement | None = None
        #: The forward pass: torch's, or a compiled backend's; and how that one was made.
        self._forward: Forward = self._torch_forward
        self.conversion: Conversion | None = None
        if is_openvino(backend):
            self._use_openvino(backend, min_agreement, openvino_cache)

    def _use_openvino(self, backend: str, min_agreement: float, cache: Path) -> None:
        """Swap in the compiled OpenVINO model, if its vectors match the torch model's."""
        self.packed = False
        queries, passages = calibration_texts()

        def measure() -> tuple[Vectors, Vectors]:
            return self.embed_queries(queries), self.embed_passages(passages)

        def batches() -> Calibration:
            held_queries, held_passages = held_out_texts()
            texts = [self.query_prefix + t for t in held_queries]
            texts += [self.passage_prefix + t for t in held_passages]
            return calibration_batches(self._runner, self.encode_texts(texts))

        def install(forward: Forward) -> None:
            self._forward = forward

        modules = ",".join(type(m).__name__ for m in self._model)
        example = [self.passage_prefix + t for t in ("a", *passages[:1])]
        job = CompileJob(
            role=EMBEDDING,
            model_id=self.model_id,
            backend=backend,
            module=Traced(self._model, _embedding),
            transformer=self._encoder,
            example=traced_example(self._runner, self.encode_texts(example)),
            calibration=batches,
            graph=f"sentence-transformers:{modules}",
        )
        self.conversion, self.agreement = compile_and_gate(
            self._runner,
            job,
            cache=cache,
            floor=min_agreement,
            measure=measure,
            compare=vector_agreement,
            install=install,
        )
        self.backend = RECIPES[backend]

    @classmethod
    def from_spec(cls, spec: ModelSpec, settings: Settings) -> SentenceTransformerEmbedder:
        """The embedder `spec` describes (`settings`: what every model shares)."""
        bound_kernel_cache(settings.cpu_kernel_cache)
        placement = resolve_placement(spec.device, spec.dtype)
        return cls(
            spec.model,
            query_prefix=spec.query_prefix,
            passage_prefix=spec.passage_prefix,
            placement=placement,
            batch_size=batch_limits(placement, spec.max_batch_size)[0],
            packed=spec.packed,
            varlen=settings.varlen_attention,
            backend=resolve_backend(
                spec.backend, role=EMBEDDING, preset=settings.preset, device=placement.device
            ),
            min_agreement=spec.min_agreement,
            openvino_cache=settings.openvino_cache,
        )

    @classmethod
    def from_settings(
        cls, settings: Settings, model_id: str | None = None
    ) -> SentenceTransformerEmbedder:
        """The embedder the settings name (`model_id`: another, with the role prefixes it was
        trained with; the prefix settings are the default one's)."""
        return cls.from_spec(
            role_spec(settings, EMBEDDING, model_id or settings.embed_model), settings
        )

    def embed_queries(self, texts: Sequence[str]) -> Vectors:
        return self._encode([self.query_prefix + t for t in texts])

    def embed_passages(self, texts: Sequence[str]) -> Vectors:
        return self._encode([self.passage_prefix + t for t in texts])

    def token_spans(self, text: str) -> TokenSpans:
        return self.tokens.spans([text])[0]

    def encode_texts(self, texts: Sequence[str]) -> list[ModelInput]:
        return self.tokens.texts(texts)

    def _torch_forward(self, batch: Batch) -> torch.Tensor:
        """Normalised sentence embeddings of a packed or padded batch, in float32."""
        if isinstance(batch, PackedBatch):
            hidden = packed_hidden(self._encoder, batch, self._runner.device, self._runner.varlen)
            pooled = (
                segment_mean(hidden, batch)
                if self._pooling == "mean"
                else first_rows(hidden, batch).float()
            )
        else:
            pooled = self._model.forward(self._runner.features(batch))["sentence_embedding"]
        return F.normalize(pooled.float(), dim=-1)

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        """Forward passes over representative shapes before serving; returns how many."""
        word = self.tokens.ids(["warm up"])[0] or [0]

        def make(length: int) -> ModelInput:
            body = length - self.tokens.template.single_specials
            return self.tokens.single((word * body)[: max(body, 1)])

        shapes = self._runner.warm_shapes(batch_items, batch_tokens, self.max_length)
        return self._runner.warm_up(make, self.forward, shapes)

    def _encode(self, texts: list[str]) -> Vectors:
        vectors = np.zeros((len(texts), self.dimension), dtype=np.float32)
        inputs = self.encode_texts(texts)
        for batch in sorted_batches([len(i) for i in inputs], self._batch_size):
            vectors[batch] = self.forward(self.collate([inputs[i] for i in batch]))
        return vectors


def _embedding(model: Any, features: dict[str, torch.Tensor]) -> torch.Tensor:
    """A sentence-transformers model's normalised sentence embeddings (encoder, pooling, any
    dense layers)."""
    return F.normalize(model(features)["sentence_embedding"].float(), dim=-1)


def _packable_pooling(modules: Sequence[Any]) -> str | None:
    """`mean` or `cls` when the model is Transformer + Pooling (+ Normalize) with a pooling
    the packed forward reproduces; else None (padded batches through sentence-transformers)."""
    names = [type(m).__name__ for m in modules]
    if names[:2] != ["Transformer", "Pooling"] or any(n != "Normalize" for n in names[2:]):
        return None
    pooling = modules[1]
    mode = getattr(pooling, "pooling_mode", None)
    if mode not in ("mean", "cls") or not getattr(pooling, "include_prompt", True):
        return None
    return str(mode)
