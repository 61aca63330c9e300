"""The reranking role's model: a one-logit cross-encoder of one of the families of
`ragrank.backends.families`, on the torch runner, or compiled by OpenVINO behind the same
runner."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ragrank.backends.agreement import (
    Agreement,
    calibration_groups,
    held_out_groups,
    rank_agreement,
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
    CompileJob,
    Conversion,
    Traced,
    calibration_batches,
    compile_and_gate,
    is_openvino,
    resolve_backend,
    traced_example,
)
from ragrank.backends.packing import (
    PADDING_OFFSET_POSITIONS,
    PackedBatch,
    packed_hidden,
    pooled_rows,
)
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
from ragrank.roles import RERANK
from ragrank.settings import OPENVINO_CACHE, Settings, env_name

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from numpy.typing import NDArray

    from ragrank.backends.packing import Batch
    from ragrank.protocols import Pair
    from ragrank.tokens import ModelInput, WindowPlan

log = logging.getLogger(__name__)


class CrossEncoderScorer(RunnerModel):
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
        self.tokens = model_tokens(
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
        self._runner = TorchRunner(
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
        #: The forward pass: torch's, or a compiled backend's; and how that one was made.
        self._forward: Forward = self._torch_forward
        self.conversion: Conversion | None = None
        #: `torch`, or the recipe of the backend that runs the model.
        self.backend = "torch"
        if is_openvino(backend):
            self._use_openvino(backend, min_agreement, openvino_cache)

    def _use_openvino(self, backend: str, min_agreement: float, cache: Path) -> None:
        """Swap in the compiled OpenVINO model, if its rankings agree with the torch model's."""
        self.packed = False
        groups = calibration_groups()

        def measure() -> list[NDArray[np.float32]]:
            return [self.score_pairs(group) for group in groups]

        def batches() -> Calibration:
            pairs = [pair for group in held_out_groups() for pair in group]
            return calibration_batches(self._runner, self.tokens.pairs(pairs))

        def install(forward: Forward) -> None:
            self._forward = forward

        query, passage = groups[0][0]
        job = CompileJob(
            role=RERANK,
            model_id=self.model_id,
            backend=backend,
            module=Traced(self._model, self.padded_logits),
            transformer=self._model,
            example=traced_example(
                self._runner, self.tokens.pairs([(query, "a"), (query, passage)])
            ),
            calibration=batches,
            graph=f"cross-encoder:{self.family.name}",
        )
        self.conversion, self.agreement = compile_and_gate(
            self._runner,
            job,
            cache=cache,
            floor=min_agreement,
            measure=measure,
            compare=rank_agreement,
            install=install,
        )
        self.backend = RECIPES[backend]

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
        for batch in sorted_batches([len(i) for i in inputs], self._batch_size):
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

    def _torch_forward(self, batch: Batch) -> torch.Tensor:
        """One float32 logit per input of a packed or padded batch, by the family's head."""
        model = self._model
        if isinstance(batch, PackedBatch):
            hidden = packed_hidden(
                model.base_model, batch, self._runner.device, self._runner.varlen
            )
            rows = pooled_rows(hidden, batch, self.family.pooling)
            # Logits leave the model in float32 whatever dtype it runs in.
            return self._head(model, rows).float().view(-1)
        return self.padded_logits(model, self._runner.features(batch))

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
