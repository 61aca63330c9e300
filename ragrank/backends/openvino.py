"""The OpenVINO backends of both model roles on the CPU: `openvino` (float32) and
`openvino-int8` (NNCF's static int8).

The loaded torch model is traced by OpenVINO's own `convert_model`, with the batch and the
length dynamic, so batches of any shape run. optimum-intel is not used: it pins an older
transformers. `openvino-int8` then quantises the converted model with NNCF's post-training
static quantisation (its transformer preset: SmoothQuant and bias correction), calibrated on
texts of the bundled multilingual sample that the agreement gate does not use.

A conversion is saved under the cache folder (`RAGRANK_OPENVINO_CACHE`), keyed by the model's
weights and configuration as loaded, the recipe, and the OpenVINO and NNCF versions, so a
restart reads it instead of converting again; a new model revision, recipe or version
converts anew.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, get_args

import numpy as np
import torch

from ragrank.backends.agreement import Measured, require_floor
from ragrank.backends.packing import PaddedBatch
from ragrank.backends.torch_runner import TorchRunner, sorted_batches
from ragrank.errors import ModelLoadError
from ragrank.roles import EMBEDDING, Role
from ragrank.settings import PRESET_CPU_BACKENDS, OpenVinoBackend, env_name

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from numpy.typing import NDArray

    from ragrank.backends.packing import Batch
    from ragrank.tokens import ModelInput

log = logging.getLogger(__name__)

OPENVINO_BACKENDS: tuple[str, ...] = get_args(OpenVinoBackend)

#: What each backend makes of a model, as its outputs' recipe records it (the document stamp,
#: the eval's cache key): a new recipe re-embeds.
RECIPES: dict[str, str] = {
    "openvino": "openvino:f32",
    "openvino-int8": "openvino-int8:nncf-static-transformer/2",
}

#: The distributions each backend imports (the `openvino` extra).
DISTRIBUTIONS: dict[str, tuple[str, ...]] = {
    "torch": (),
    "openvino": ("openvino",),
    "openvino-int8": ("openvino", "nncf"),
}

#: Bump when what is traced changes (the wrappers below, the inputs it takes).
GRAPH_FORMAT = 2


def is_openvino(backend: str) -> bool:
    return backend in OPENVINO_BACKENDS


def resolve_backend(backend: str, *, role: Role, preset: str | None, device: str) -> str:
    """The backend that runs: `auto` is the preset's CPU backend for the role on a CPU where
    OpenVINO is installed (`PRESET_CPU_BACKENDS`), else `torch`."""
    if backend != "auto":
        return backend
    chosen = PRESET_CPU_BACKENDS.get(preset) if preset in PRESET_CPU_BACKENDS else None
    if chosen is None or device != "cpu":
        return "torch"
    picked: str = chosen[0] if role is EMBEDDING else chosen[1]
    if is_openvino(picked) and importlib.util.find_spec("openvino") is None:
        log.warning(
            "%s=auto: OpenVINO is not installed, so the %s model runs on torch (pip install "
            "'ragrank[openvino]' for the faster CPU backend)",
            env_name(role.setting("backend")),
            role.label,
        )
        return "torch"
    return picked


def require_runtime(role: Role, backend: str, device: str) -> Any:
    """The `openvino` module, or a `ModelLoadError` naming the role's backend setting when it
    is not installed, or when the model is placed on another device than the CPU."""
    setting = env_name(role.setting("backend"))
    if device != "cpu":
        raise ModelLoadError(
            f"{setting}={backend} runs on the CPU only; set {setting}=torch on {device}"
        )
    try:
        import openvino
    except ImportError:
        raise ModelLoadError(
            f"{setting}={backend} needs OpenVINO, which is not installed: pip install "
            f"'ragrank[openvino]' (`make setup` and the CPU image have it), or set "
            f"{setting}=torch"
        ) from None
    if backend == "openvino-int8":
        try:
            import nncf  # noqa: F401
        except ImportError:
            raise ModelLoadError(
                f"{setting}=openvino-int8 quantises with NNCF, which is not installed: pip "
                f"install 'ragrank[openvino]', or set {setting}=openvino"
            ) from None
    return openvino


def _version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "absent"


def model_folder(model_id: str) -> Path:
    """The folder a loaded model's files are in: the local folder the setting names, or its
    snapshot in the Hugging Face cache."""
    local = Path(model_id).expanduser()
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model_id, local_files_only=True))


def files_digest(folder: Path) -> str:
    """A digest of the names and contents of every file in `folder` (a model's weights,
    configuration and tokenizer)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder)};".encode())
        with path.open("rb") as handle:
            digest.update(hashlib.file_digest(handle, "sha256").digest())
    return digest.hexdigest()


def cache_key(*, weights: str, backend: str, inputs: Sequence[str], graph: str) -> str:
    """What a saved conversion is stored under: the weights, what was traced, the recipe and
    the library versions."""
    fields = {
        "weights": weights,
        "graph": graph,
        "graph_format": GRAPH_FORMAT,
        "inputs": list(inputs),
        "recipe": RECIPES[backend],
        "openvino": _version("openvino"),
        "nncf": _version("nncf") if backend == "openvino-int8" else None,
    }
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:24]


@dataclass(frozen=True)
class Conversion:
    """How a backend's model was made: read from the cache, or converted (and quantised) now."""

    path: Path
    cached: bool
    convert_s: float = 0.0
    quantize_s: float = 0.0
    compile_s: float = 0.0

    def __str__(self) -> str:
        if self.cached:
            return f"read from {self.path}, compiled in {self.compile_s:.1f} s"
        quantized = f", quantised in {self.quantize_s:.1f} s" if self.quantize_s else ""
        return (
            f"converted in {self.convert_s:.1f} s{quantized}, compiled in "
            f"{self.compile_s:.1f} s, saved to {self.path}"
        )


class CompiledModel:
    """A compiled OpenVINO model: a padded batch's features in, its one output out, on the
    caller's thread (the runner's lock makes it one pass at a time)."""

    def __init__(self, compiled: Any, inputs: Sequence[str]) -> None:
        self._request = compiled.create_infer_request()
        self.inputs = list(inputs)

    def __call__(self, features: dict[str, torch.Tensor]) -> NDArray[np.float32]:
        arrays = {name: features[name].numpy() for name in self.inputs}
        result = self._request.infer(arrays)
        return np.array(result[0], dtype=np.float32)


#: Calibration batches for NNCF: each a padded batch's features as numpy arrays.
Calibration = list[dict[str, "NDArray[np.int64]"]]


def compiled_model(
    module: torch.nn.Module,
    *,
    role: Role,
    model_id: str,
    backend: str,
    example: dict[str, torch.Tensor],
    calibration: Callable[[], Calibration],
    cache: Path,
    graph: str,
) -> tuple[CompiledModel, Conversion]:
    """`module` (its forward taking `example`'s keys by name) as a compiled OpenVINO model on
    the CPU: read from `cache` when converted before, else converted, for `openvino-int8`
    quantised on `calibration()`, and saved there. `graph` names what `module` computes from
    the model's files (its pooling, its head)."""
    ov = require_runtime(role, backend, "cpu")
    inputs = list(example)
    weights = files_digest(model_folder(model_id))
    key = cache_key(weights=weights, backend=backend, inputs=inputs, graph=graph)
    folder = cache.expanduser() / f"{_slug(model_id)}-{backend}-{key}"
    xml = folder / "model.xml"
    if xml.exists():
        model, conversion = ov.Core().read_model(xml), Conversion(folder, cached=True)
    else:
        model, conversion = _convert(
            ov, module, backend=backend, example=example, calibration=calibration, folder=folder
        )
    started = time.perf_counter()
    compiled = ov.Core().compile_model(
        model,
        "CPU",
        {
            "INFERENCE_NUM_THREADS": torch.get_num_threads(),
            # Float parts in float32 on every CPU: bf16, OpenVINO's default where the CPU has
            # AMX, would move the outputs away from what the gate and the eval measured.
            "INFERENCE_PRECISION_HINT": "f32",
            # One pass at a time, the batch as large as the engine makes it.
            "PERFORMANCE_HINT": "LATENCY",
        },
    )
    conversion = Conversion(
        conversion.path,
        conversion.cached,
        conversion.convert_s,
        conversion.quantize_s,
        time.perf_counter() - started,
    )
    return CompiledModel(compiled, inputs), conversion


def _convert(
    ov: Any,
    module: torch.nn.Module,
    *,
    backend: str,
    example: dict[str, torch.Tensor],
    calibration: Callable[[], Calibration],
    folder: Path,
) -> tuple[Any, Conversion]:
    """Trace `module`, quantise it for `openvino-int8`, and save it to `folder` atomically (a
    process that converts the same model at the same time leaves one of the two)."""
    started = time.perf_counter()
    with torch.inference_mode(False), torch.no_grad(), warnings.catch_warnings():
        # The tracer warns of each Python branch on a shape it records; `example` is padded
        # so that the branches taken hold for every batch (see `models._example`).
        warnings.simplefilter("ignore", torch.jit.TracerWarning)
        model = ov.convert_model(module, example_input=example)
    converted = time.perf_counter()
    quantize_s = 0.0
    if backend == "openvino-int8":
        import nncf

        batches = calibration()
        # The overflow fix on every layer (7-bit weights): without VNNI (AVX2-only CPUs) int8
        # products saturate, and a reranker's order breaks; NNCF's default fixes only the first.
        model = nncf.quantize(
            model,
            nncf.Dataset(batches),
            model_type=nncf.ModelType.TRANSFORMER,
            subset_size=len(batches),
            advanced_parameters=nncf.AdvancedQuantizationParameters(
                overflow_fix=nncf.OverflowFix.ENABLE
            ),
        )
        quantize_s = time.perf_counter() - converted
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        ov.save_model(model, staging / "model.xml", compress_to_fp16=False)
        os.replace(staging, folder)
    except OSError:
        if not (folder / "model.xml").exists():
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return model, Conversion(
        folder, cached=False, convert_s=converted - started, quantize_s=quantize_s
    )


#: The attention the traced models run with (`traceable`).
TRACED_ATTENTION = "ragrank_traced"


def _traced_attention(  # noqa: PLR0917 (transformers' attention signature)
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' SDPA, with each query allowed to see its own position. In a padded
    batch, a padding row of a sliding-window layer (ModernBERT's local layers) may see no key
    at all; OpenVINO's softmax makes that row NaN, and the NaN then reaches every real row
    through the padding keys' zero weights. A real row always sees itself, so it is
    unchanged."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if attention_mask is not None:
        rows, columns = attention_mask.shape[-2:]
        itself = torch.eye(rows, columns, dtype=torch.bool, device=attention_mask.device)
        if attention_mask.dtype == torch.bool:
            attention_mask = attention_mask | itself
        else:
            attention_mask = attention_mask.masked_fill(itself, 0.0)
    output: tuple[torch.Tensor, None] = sdpa_attention_forward(
        module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs
    )
    return output


def traceable(model: Any) -> None:
    """Run `model` (a transformers model) with `TRACED_ATTENTION`, before it is traced; a
    model without transformers' attention interface keeps its own."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(TRACED_ATTENTION, _traced_attention)
    AttentionMaskInterface.register(TRACED_ATTENTION, sdpa_mask)
    try:
        model.set_attn_implementation(TRACED_ATTENTION)
    except (ValueError, NotImplementedError, AttributeError):
        log.info("%s keeps its own attention for tracing", type(model).__name__)


def _slug(model_id: str) -> str:
    """A short, readable folder name for a model id or path."""
    name = Path(model_id.rstrip("/")).name or "model"
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:48]


def release(module: torch.nn.Module) -> None:
    """Free `module`'s tensors once the compiled model replaces it (the compiled model holds
    its own copy of the weights)."""
    module.to("meta")


class Traced(torch.nn.Module):  # type: ignore[misc]  # untyped in torch
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


#: Items in each batch that static quantisation calibrates on.
CALIBRATION_BATCH = 16


def calibration_batches(runner: TorchRunner, inputs: Sequence[ModelInput]) -> Calibration:
    """`inputs` as length-sorted padded batches, in the arrays OpenVINO reads."""
    batches = []
    for rows in sorted_batches([len(i) for i in inputs], CALIBRATION_BATCH):
        batch = runner.collate([inputs[i] for i in rows], packed=False)
        assert isinstance(batch, PaddedBatch)
        batches.append({k: v.numpy() for k, v in batch.features.items()})
    return batches


def traced_example(runner: TorchRunner, inputs: Sequence[ModelInput]) -> dict[str, torch.Tensor]:
    """A padded batch to trace with, of inputs of different lengths, so that the traced graph
    takes the attention mask's padded path, which every batch shape then runs."""
    assert len({len(i) for i in inputs}) > 1, "a traced batch needs padding"
    batch = runner.collate(inputs, packed=False)
    assert isinstance(batch, PaddedBatch)
    return dict(batch.features)


def compiled_forward(compiled: CompiledModel) -> Callable[[Batch], torch.Tensor]:
    """A compiled model as a runner's forward pass: padded batches only."""

    def forward(batch: Batch) -> torch.Tensor:
        assert isinstance(batch, PaddedBatch), "a compiled model runs padded batches"
        return torch.from_numpy(compiled(batch.features))

    return forward


Measure = TypeVar("Measure")
Gated = TypeVar("Gated", bound=Measured)


@dataclass(frozen=True)
class CompileJob:
    """What a model hands the one compile step: what to trace, with what, and its name."""

    role: Role
    model_id: str
    backend: str
    #: The model and what its role computes with it, as one traceable forward.
    module: Traced
    #: The transformers model inside it, whose attention is made traceable.
    transformer: Any
    example: dict[str, torch.Tensor]
    calibration: Callable[[], Calibration]
    #: Names what `module` computes from the model's files (its pooling, its head).
    graph: str


def compile_and_gate(
    runner: TorchRunner,
    job: CompileJob,
    *,
    cache: Path,
    floor: float,
    measure: Callable[[], Measure],
    compare: Callable[[Measure, Measure], Gated],
    install: Callable[[Callable[[Batch], torch.Tensor]], None],
) -> tuple[Conversion, Gated]:
    """The one way a model moves to a compiled backend: convert (or read from `cache`), swap
    the compiled forward in (`install`), and keep it only if what the model computes
    (`measure`) still agrees with torch float32's by `compare`, at least `floor`; the torch
    weights are then released."""
    require_runtime(job.role, job.backend, runner.device)
    runner.pad_only(job.backend)
    reference = measure()
    traceable(job.transformer)
    compiled, conversion = compiled_model(
        job.module.eval(),
        role=job.role,
        model_id=job.model_id,
        backend=job.backend,
        example=job.example,
        calibration=job.calibration,
        cache=cache,
        graph=job.graph,
    )
    install(compiled_forward(compiled))
    agreement = compare(reference, measure())
    require_floor(agreement, role=job.role, model_id=job.model_id, backend=job.backend, floor=floor)
    release(job.module.model)
    log.info(
        "%s model: %s backend in use (%s); against torch float32: %s",
        job.role.label,
        job.backend,
        conversion,
        agreement,
    )
    return conversion, agreement
