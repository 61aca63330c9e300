"""`make bench-served`'s pieces: the device model's arithmetic, the ideal engine's latencies
and the device-model reranker, which must keep the real host path (tokenizer, windows, packed
collation) and only replace the forward pass."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from eval.bench.device_model import (
    H200_BATCH_TOKENS,
    H200_SCIFACT_MEAN_TOKENS,
    H200_SCIFACT_PAIRS_PER_S,
    DeviceModel,
    DeviceModelScorer,
)
from eval.bench.served import ideal_latencies

if TYPE_CHECKING:
    from ragrank.backends.models import CrossEncoderScorer


def test_the_fitted_device_reproduces_the_measured_scifact_rate():
    device = DeviceModel.h200()
    pairs = [int(H200_SCIFACT_MEAN_TOKENS)] * 86 * 20  # 86 pairs fill 32,768 tokens
    assert device.capacity(pairs, 256, H200_BATCH_TOKENS) == pytest.approx(
        H200_SCIFACT_PAIRS_PER_S, rel=0.02
    )
    assert DeviceModel.h200(speed=2).seconds(1000) == pytest.approx(device.seconds(1000) / 2)
    assert DeviceModel.h200(speed=0).seconds(10**6) == 0.0


def test_an_ideal_engine_answers_a_lone_request_in_its_own_device_time():
    device = DeviceModel(rate=1000.0, launch=0.01)
    latencies = ideal_latencies([0.0], [[100, 100]], device)
    assert latencies == [pytest.approx(210.0)]


def test_an_ideal_engine_queues_what_arrives_while_the_device_is_busy():
    device = DeviceModel(rate=1000.0, launch=0.0)
    # The second request arrives during the first's 1 s pass and starts when it ends.
    latencies = ideal_latencies([0.0, 0.5], [[1000], [1000]], device)
    assert latencies == [pytest.approx(1000.0), pytest.approx(1500.0)]
    # Arriving together they share one pass.
    assert ideal_latencies([0.0, 0.0], [[100], [100]], device) == [
        pytest.approx(200.0),
        pytest.approx(200.0),
    ]


def test_the_device_model_reranker_collates_for_real_and_sleeps_its_device_time(
    scorer: CrossEncoderScorer,
):
    device = DeviceModel(rate=10_000.0, launch=0.02)
    modelled = DeviceModelScorer(scorer, device)
    plan = modelled.plan_windows("what is a river", ["a river flows", "lakes are still"])
    batch = modelled.collate(plan.inputs)
    assert batch.bounds[-1] == sum(len(item) for item in plan.inputs)
    started = time.perf_counter()
    logits = modelled.fetch(modelled.launch(batch))
    assert time.perf_counter() - started >= device.seconds(batch.bounds[-1]) * 0.9
    assert logits.shape == (len(plan.inputs),)
