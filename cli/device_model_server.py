"""`python -m cli.device_model_server SPEED`: `ragrank serve`, configured from the environment
as usual, with its default reranker's forward pass replaced by the calibrated device model
(`eval.bench.device_model`) at SPEED times the measured GPU (0: instant). `make bench-served`
starts it; it wires the eval's device model into the server, which only the composition root
may do."""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from cli.compose import load_services
from eval.bench.device_model import DeviceModel, DeviceModelScorer
from ragrank.backends.models import CrossEncoderScorer
from ragrank.inference import Inference, Served
from ragrank.logs import configure_logging
from ragrank.settings import Settings
from server import create_app
from server.app import serve


def main(argv: list[str]) -> int:
    settings = Settings.from_env()
    configure_logging(settings.log_format, settings.log_level)
    speed = float(argv[0]) if argv else 1.0
    services = load_services(settings)
    inference = services.inference
    default = inference.rerankers[0]
    if not isinstance(default.model, CrossEncoderScorer):
        raise SystemExit("the device model wraps a cross-encoder")
    modelled: Served[Any] = Served(
        default.spec, DeviceModelScorer(default.model, DeviceModel.h200(speed))
    )
    services = dataclasses.replace(
        services, inference=Inference(inference.embedders, [modelled], settings)
    )
    try:
        serve(create_app(settings, services=services), settings)
    finally:
        services.store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
