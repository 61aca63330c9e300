"""The two model roles: an embedder (bi-encoder) and a scorer (cross-encoder).

Each role is a small Protocol (`ragrank.protocols`) so the server, the indexer and the tests can
swap in fakes; these real implementations load through sentence-transformers, by hub id or local
folder.

Work is split by thread, so the server can overlap it: tokenising, planning and collating
(`encode_texts`, `plan_windows`, `collate`) run on host threads, each with its own tokenizer
copy; `forward` runs on the model's thread and never tokenises.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812

from ragrank.backends.agreement import (
    Agreement,
    VectorAgreement,
    calibration_groups,
    calibration_texts,
    held_out_groups,
    held_out_texts,
    rank_agreement,
    require_floor,
    vector_agreement,
)
from ragrank.backends.families import (
    SHORT_CONTEXT_TOKENS,
    pair_prompt,
    reranker_family,
    window_length,
)
from ragrank.backends.openvino import (
    RECIPES,
    Calibration,
    CompiledModel,
    Conversion,
    compiled_model,
    is_openvino,
    release,
    require_runtime,
    resolve_backend,
    traceable,
)
from ragrank.backends.packing import (
    ATTENTION,
    PADDING_OFFSET_POSITIONS,
    Batch,
    PackedBatch,
    PaddedBatch,
    collate_packed,
    collate_padded,
    first_position,
    first_rows,
    packed_hidden,
    packing_family,
    pooled_rows,
    register_attention,
    resolve_varlen_backend,
    segment_mean,
)
from ragrank.device import Placement, batch_limits, bound_kernel_cache, resolve_placement
from ragrank.errors import BatchTooLargeError, ModelFailedError, ModelLoadError, SettingsError
from ragrank.inference.spec import ModelSpec, role_spec
from ragrank.loading import load_model
from ragrank.roles import EMBEDDING, RERANK, Role
from ragrank.settings import OPENVINO_CACHE, Settings, env_name
from ragrank.tokens import ModelInput, Tokens, TokenSpans, WindowPlan

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence
    from pathlib import Path

    from numpy.typing import NDArray

    from ragrank.protocols import Pair, Vectors

log = logging.getLogger(__name__)


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


class _Runner:
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


def _tokens(tokenizer: Any, max_length: int, role: Role, model_id: str, **layout: Any) -> Tokens:
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


def _sorted_batches(lengths: Sequence[int], size: int) -> Iterator[list[int]]:
    """Indices in ascending length, `size` at a time: little padding for callers that batch
    a whole list themselves."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    for start in range(0, len(order), size):
        yield order[start : start + size]


class SentenceTransformerEmbedder:
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
        self.tokens = _tokens(self._model.tokenizer, self.max_length, EMBEDDING, model_id)
        modules: list[Any] = list(self._model)
        self._pooling = _packable_pooling(modules)
        self._encoder: torch.nn.Module = modules[0].auto_model
        self._runner = _Runner(
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
        #: The compiled model of an OpenVINO backend, and how it was made.
        self._openvino: CompiledModel | None = None
        self.conversion: Conversion | None = None
        if is_openvino(backend):
            self._use_openvino(backend, min_agreement, openvino_cache)

    def _use_openvino(self, backend: str, min_agreement: float, cache: Path) -> None:
        """Swap in the compiled OpenVINO model, if its vectors match the torch model's."""
        require_runtime(EMBEDDING, backend, self._runner.device)
        self._runner.pad_only(backend)
        self.packed = False
        queries, passages = calibration_texts()
        reference = self.embed_queries(queries), self.embed_passages(passages)

        def batches() -> Calibration:
            held_queries, held_passages = held_out_texts()
            texts = [self.query_prefix + t for t in held_queries]
            texts += [self.passage_prefix + t for t in held_passages]
            return _calibration_batches(self._runner, self.encode_texts(texts))

        modules = ",".join(type(m).__name__ for m in self._model)
        traceable(self._encoder)
        self._openvino, self.conversion = compiled_model(
            _Traced(self._model, _embedding).eval(),
            role=EMBEDDING,
            model_id=self.model_id,
            backend=backend,
            example=_example(
                self._runner,
                self.encode_texts([self.passage_prefix + t for t in ("a", *passages[:1])]),
            ),
            calibration=batches,
            cache=cache,
            graph=f"sentence-transformers:{modules}",
        )
        self.agreement = vector_agreement(
            reference, (self.embed_queries(queries), self.embed_passages(passages))
        )
        require_floor(
            self.agreement,
            role=EMBEDDING,
            model_id=self.model_id,
            backend=backend,
            floor=min_agreement,
        )
        self.backend = RECIPES[backend]
        release(self._model)
        log.info(
            "embedder: %s backend in use (%s); against torch float32: %s",
            backend,
            self.conversion,
            self.agreement,
        )

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

    def collate(self, inputs: Sequence[ModelInput], *, packed: bool | None = None) -> Batch:
        return self._runner.collate(inputs, packed)

    def forward(self, batch: Any) -> Vectors:
        return self.fetch(self.launch(batch))

    def upload(self, batch: Batch) -> Batch:
        """The batch on the model's device (model thread, before `launch`)."""
        return self._runner.upload(batch)

    def launch(self, batch: Any) -> Launched:
        """The forward pass, its vectors queued for the host (model thread)."""
        with self._runner.running():
            if self._openvino is not None:
                assert isinstance(batch, PaddedBatch), "a compiled model runs padded batches"
                return Launched(torch.from_numpy(self._openvino(batch.features)), None)
            if isinstance(batch, PackedBatch):
                hidden = packed_hidden(
                    self._encoder, batch, self._runner.device, self._runner.varlen
                )
                pooled = (
                    segment_mean(hidden, batch)
                    if self._pooling == "mean"
                    else first_rows(hidden, batch).float()
                )
            else:
                pooled = self._model.forward(self._runner.features(batch))["sentence_embedding"]
            return self._runner.launched(F.normalize(pooled.float(), dim=-1))

    def fetch(self, launched: Launched) -> Vectors:
        """The vectors of a launched pass, once on the host."""
        return launched.host()

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
        for batch in _sorted_batches([len(i) for i in inputs], self._batch_size):
            vectors[batch] = self.forward(self.collate([inputs[i] for i in batch]))
        return vectors


class _Traced(torch.nn.Module):  # type: ignore[misc]  # untyped in torch
    """A model and what a role computes with it from a padded batch's features, as one
    forward: what OpenVINO traces, so its graph returns what the torch path returns."""

    def __init__(
        self, model: Any, compute: Callable[[Any, dict[str, torch.Tensor]], torch.Tensor]
    ) -> None:
        super().__init__()
        self.model = model
        self.compute = [compute]  # in a list: a plain callable, never a submodule

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            features["token_type_ids"] = token_type_ids
        return self.compute[0](self.model, features)


def _embedding(model: Any, features: dict[str, torch.Tensor]) -> torch.Tensor:
    """A sentence-transformers model's normalised sentence embeddings (encoder, pooling, any
    dense layers)."""
    return F.normalize(model(features)["sentence_embedding"].float(), dim=-1)


#: Items in each batch that static quantisation calibrates on.
CALIBRATION_BATCH = 16


def _calibration_batches(runner: _Runner, inputs: Sequence[ModelInput]) -> Calibration:
    """`inputs` as length-sorted padded batches, in the arrays OpenVINO reads."""
    batches = []
    for rows in _sorted_batches([len(i) for i in inputs], CALIBRATION_BATCH):
        batch = runner.collate([inputs[i] for i in rows], packed=False)
        assert isinstance(batch, PaddedBatch)
        batches.append({k: v.numpy() for k, v in batch.features.items()})
    return batches


def _example(runner: _Runner, inputs: Sequence[ModelInput]) -> dict[str, torch.Tensor]:
    """A padded batch to trace with, of inputs of different lengths, so that the traced graph
    takes the attention mask's padded path, which every batch shape then runs."""
    assert len({len(i) for i in inputs}) > 1, "a traced batch needs padding"
    batch = runner.collate(inputs, packed=False)
    assert isinstance(batch, PaddedBatch)
    return dict(batch.features)


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


class CrossEncoderScorer:
    """A one-logit reranker of one of the families of `ragrank.backends.families`, run batch
    by batch under `torch.inference_mode()`.

    The forward pass is written out (rather than `CrossEncoder.predict`) so that the model reads
    ids assembled once, batches can be packed, and logits are read in float32 whatever dtype the
    model runs in. Each family reads its own row of the last hidden states (the first token,
    the mean, or the last token) and turns it into one logit with its own head.
    """

    def __init__(
        self,
        model_id: str,
        *,
        placement: Placement,
        batch_size: int = 16,
        max_length: int = 0,
        backend: str = "torch",
        min_agreement: float = 0.9,
        packed: str = "off",
        varlen: str = "auto",
        instruction: str | None = None,
        openvino_cache: Path = OPENVINO_CACHE,
    ) -> None:
        from sentence_transformers import CrossEncoder

        def loader(source: str) -> CrossEncoder:
            encoder: CrossEncoder = CrossEncoder(
                source,
                device=placement.device,
                max_length=max_length or None,
                model_kwargs={"dtype": placement.dtype},
            )
            return encoder

        encoder = load_model(RERANK.label, model_id, env_name(RERANK.setting("model")), loader)
        model = encoder.transformers_model
        if model is None:
            raise ModelLoadError(
                f"The reranking model {model_id!r} is not a transformers model; "
                f"set {env_name('rerank_model')} to a Hugging Face cross-encoder."
            )
        self.family = reranker_family(model, model_id)
        if encoder.num_labels != 1:
            raise ModelLoadError(
                f"The reranking model {model_id!r} has {encoder.num_labels} output labels; "
                f"ragrank needs a one-logit cross-encoder. Set {env_name('rerank_model')}."
            )
        self.model_id = model_id
        model.train(False)
        self._model: Any = model
        tokenizer = encoder.tokenizer
        self.max_length = window_length(self.family, max_length, _model_limit(model, tokenizer))
        prompt = pair_prompt(tokenizer, instruction) if self.family.prompted else None
        self.tokens = _tokens(
            tokenizer,
            self.max_length,
            RERANK,
            model_id,
            prompt=prompt,
            types=self.family.token_types,
        )
        #: The decoder's `yes` minus `no` row of its output layer: one dot product per pair
        #: gives the log-odds, with no projection onto the whole vocabulary.
        self._direction: torch.Tensor | None = None
        if self.family.head == "yes-no":
            self._direction = _yes_no_direction(encoder, model, model_id)
        self._runner = _Runner(
            model,
            self.tokens,
            placement,
            packed=packed,
            varlen=varlen,
            role=RERANK,
            model_id=model_id,
        )
        self.packed = self._runner.packed
        self._batch_size = batch_size
        #: How the backend ranks against torch's float32 model; None on the torch backend.
        self.agreement: Agreement | None = None
        #: The compiled model of an OpenVINO backend, and how it was made.
        self._openvino: CompiledModel | None = None
        self.conversion: Conversion | None = None
        #: `torch`, or the recipe of the backend that runs the model.
        self.backend = "torch"
        if is_openvino(backend):
            self._use_openvino(backend, min_agreement, openvino_cache)

    def _use_openvino(self, backend: str, min_agreement: float, cache: Path) -> None:
        """Swap in the compiled OpenVINO model, if its rankings agree with the torch model's."""
        require_runtime(RERANK, backend, self._runner.device)
        self._runner.pad_only(backend)
        self.packed = False
        groups = calibration_groups()
        reference = [self.score_pairs(group) for group in groups]

        def batches() -> Calibration:
            pairs = [pair for group in held_out_groups() for pair in group]
            return _calibration_batches(self._runner, self.tokens.pairs(pairs))

        query, passage = groups[0][0]
        traceable(self._model)
        self._openvino, self.conversion = compiled_model(
            _Traced(self._model, self.padded_logits).eval(),
            role=RERANK,
            model_id=self.model_id,
            backend=backend,
            example=_example(self._runner, self.tokens.pairs([(query, "a"), (query, passage)])),
            calibration=batches,
            cache=cache,
            graph=f"cross-encoder:{self.family.name}",
        )
        self.agreement = rank_agreement(reference, [self.score_pairs(g) for g in groups])
        require_floor(
            self.agreement,
            role=RERANK,
            model_id=self.model_id,
            backend=backend,
            floor=min_agreement,
        )
        self.backend = RECIPES[backend]
        release(self._model)
        log.info(
            "reranker: %s backend in use (%s); against torch float32: %s",
            backend,
            self.conversion,
            self.agreement,
        )

    @classmethod
    def from_spec(cls, spec: ModelSpec, settings: Settings) -> CrossEncoderScorer:
        """The reranker `spec` describes (`settings`: what every model shares)."""
        bound_kernel_cache(settings.cpu_kernel_cache)
        placement = resolve_placement(spec.device, spec.dtype)
        return cls(
            spec.model,
            placement=placement,
            batch_size=batch_limits(placement, spec.max_batch_size)[0],
            max_length=spec.max_length,
            backend=resolve_backend(
                spec.backend, role=RERANK, preset=settings.preset, device=placement.device
            ),
            min_agreement=spec.min_agreement,
            packed=spec.packed,
            varlen=settings.varlen_attention,
            instruction=spec.instruction or None,
            openvino_cache=settings.openvino_cache,
        )

    @classmethod
    def from_settings(cls, settings: Settings, model_id: str | None = None) -> CrossEncoderScorer:
        """The reranker the settings name (`model_id`: another, configured the same way)."""
        return cls.from_spec(
            role_spec(settings, RERANK, model_id or settings.rerank_model), settings
        )

    def score(self, query: str, passages: Sequence[str]) -> NDArray[np.float32]:
        """Logits for one query against many passages, in length-sorted batches."""
        inputs = self.tokens.pairs([(query, passage) for passage in passages])
        logits = np.zeros(len(inputs), dtype=np.float32)
        for batch in _sorted_batches([len(i) for i in inputs], self._batch_size):
            logits[batch] = self.forward(self.collate([inputs[i] for i in batch]))
        return logits

    def score_pairs(self, pairs: Sequence[Pair]) -> NDArray[np.float32]:
        if not pairs:
            return np.zeros(0, dtype=np.float32)
        return self.forward(self.collate(self.tokens.pairs(pairs)))

    def plan_windows(
        self, query: str, documents: Sequence[str], max_tokens_per_doc: int | None = None
    ) -> WindowPlan:
        return self.tokens.plan_windows(query, documents, max_tokens_per_doc)

    def collate(self, inputs: Sequence[ModelInput], *, packed: bool | None = None) -> Batch:
        return self._runner.collate(inputs, packed)

    def forward(self, batch: Any) -> NDArray[np.float32]:
        return self.launch(batch).host()

    def upload(self, batch: Batch) -> Batch:
        """The batch on the model's device (model thread, before `launch`)."""
        return self._runner.upload(batch)

    def launch(self, batch: Any) -> Launched:
        """The forward pass, its logits queued for the host (model thread)."""
        model = self._model
        with self._runner.running():
            if self._openvino is not None:
                assert isinstance(batch, PaddedBatch), "a compiled model runs padded batches"
                return Launched(torch.from_numpy(self._openvino(batch.features)), None)
            if isinstance(batch, PackedBatch):
                base = model.base_model
                hidden = packed_hidden(base, batch, self._runner.device, self._runner.varlen)
                rows = pooled_rows(hidden, batch, self.family.pooling)
                # Logits leave the model in float32 whatever dtype it runs in.
                output = self._head(model, rows).float().view(-1)
            else:
                output = self.padded_logits(model, self._runner.features(batch))
            return self._runner.launched(output)

    def fetch(self, launched: Launched) -> NDArray[np.float32]:
        """The logits of a launched pass, once on the host."""
        return launched.host()

    def warm_up(self, batch_items: int, batch_tokens: int) -> int:
        """Forward passes over representative shapes before serving; returns how many."""
        word = self.tokens.ids(["warm up"])[0] or [0]
        specials = self.tokens.template.pair_specials

        def make(length: int) -> ModelInput:
            body = max(length - specials - 8, 1)
            return self.tokens.pair((word * 8)[:8], (word * body)[:body])

        shapes = self._runner.warm_shapes(batch_items, batch_tokens, self.max_length)
        return self._runner.warm_up(make, self.forward, shapes)

    def padded_logits(self, model: Any, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """One float32 logit per row of a padded batch, by the family's own head."""
        if self.family.pooling == "last":
            output = self._head(model, self._last_padded_rows(model, features))
        else:
            output = model(**features).logits
        # Logits leave the model in float32 whatever dtype it runs in.
        return output.float().view(-1)

    def _last_padded_rows(self, model: Any, features: dict[str, torch.Tensor]) -> torch.Tensor:
        """A decoder's last hidden row of each right-padded input: its last real token."""
        states = model.base_model(**features, use_cache=False).last_hidden_state
        ends = features["attention_mask"].sum(dim=1) - 1
        last: torch.Tensor = states[torch.arange(states.shape[0], device=states.device), ends]
        return last

    def _head(self, model: Any, rows: torch.Tensor) -> torch.Tensor:
        """One logit per row, by the family's own head."""
        head = self.family.head
        if head == "yes-no":
            assert self._direction is not None
            return rows.float() @ self._direction
        if head == "score":
            score: torch.Tensor = model.score(rows)
            return score
        if head == "modernbert":
            classified: torch.Tensor = model.classifier(model.head(rows))
            return classified
        if head == "bert-pooler":
            rows = model.base_model.pooler(rows[:, None, :])
            return model.classifier(rows)
        return model.classifier(rows[:, None, :])


def _model_limit(model: Any, tokenizer: Any) -> int:
    """The longest input the model reads: its tokenizer's limit where that is set sensibly,
    else its position table's (less XLM-R's two reserved positions)."""
    config = model.config
    positions = int(getattr(config, "max_position_embeddings", 0) or 0)
    if getattr(config, "model_type", "") in PADDING_OFFSET_POSITIONS:
        positions -= int(config.pad_token_id) + 1
    stated = int(getattr(tokenizer, "model_max_length", 0) or 0)
    limits = [n for n in (stated, positions) if 0 < n < 1_000_000]
    return min(limits) if limits else SHORT_CONTEXT_TOKENS


def _yes_no_direction(encoder: Any, model: Any, model_id: str) -> torch.Tensor:
    """The output layer's `yes` row minus its `no` row, in float32, with the token ids the
    model folder names (sentence-transformers' LogitScore module), else the tokenizer's own
    `yes` and `no`."""
    from sentence_transformers.cross_encoder.modules import LogitScore

    scores = [m for m in encoder if isinstance(m, LogitScore)]
    yes = scores[0].true_token_id if scores else None
    no = scores[0].false_token_id if scores else None
    if yes is None or no is None:
        yes = encoder.tokenizer.convert_tokens_to_ids("yes")
        no = encoder.tokenizer.convert_tokens_to_ids("no")
    unknown = encoder.tokenizer.unk_token_id
    if yes is None or no is None or unknown in (yes, no):
        raise ModelLoadError(
            f"The reranking model {model_id!r} is a decoder whose folder names no `yes` and "
            f"`no` tokens to score by; set {env_name('rerank_model')} to a Qwen3-Reranker "
            f"checkpoint or its `-seq-cls` conversion."
        )
    weight = model.get_output_embeddings().weight
    return (weight[int(yes)] - weight[int(no)]).detach().float()
