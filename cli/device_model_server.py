"""`python -m cli.device_model_server SPEED [--embedder]`: `ragrank serve`, configured from the
environment as usual, with its default reranker's forward pass (and with `--embedder` its
default embedder's too) replaced by the calibrated device model (`eval.bench.device_model`) at
SPEED times the measured GPU (0: instant). `make bench-served` and the search-while-indexing
benchmark start it; it wires the eval's device model into the server, which only the
composition root may do."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from cli.compose import load_services
from cli.stack import stack_app
from eval.bench.device_model import DeviceModel, DeviceModelEmbedder, DeviceModelScorer
from ragrank.backends.models import CrossEncoderScorer, SentenceTransformerEmbedder
from ragrank.inference import Inference, Served
from ragrank.logs import configure_logging
from ragrank.settings import Settings
from server.app import serve


def main(argv: list[str]) -> int:
    settings = Settings.from_env()
    configure_logging(settings.log_format, settings.log_level)
    speed = float(argv[0]) if argv else 1.0
    device = DeviceModel.h200(speed)
    services = load_services(settings)
    inference = services.inference
    default = inference.rerankers[0]
    if not isinstance(default.model, CrossEncoderScorer):
        raise SystemExit("the device model wraps a cross-encoder")
    rerankers: list[Served[Any]] = [Served(default.spec, DeviceModelScorer(default.model, device))]
    embedders: list[Served[Any]] = list(inference.embedders)
    if "--embedder" in argv[1:]:
        embedder = embedders[0]
        if not isinstance(embedder.model, SentenceTransformerEmbedder):
            raise SystemExit("the device model wraps a sentence-transformers embedder")
        embedders[0] = Served(embedder.spec, DeviceModelEmbedder(embedder.model, device))
    services = dataclasses.replace(services, inference=Inference(embedders, rerankers, settings))
    try:
        serve(stack_app(settings, services), settings)
    finally:
        if services.jobs is not None:
            services.jobs.close()
        services.store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
