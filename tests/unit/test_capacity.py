"""Capacity profiles: measurement with a stand-in engine, storage, and the host rule."""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pytest

from graylane.capacity import (
    BatchPoint,
    CapacityError,
    CapacityProfile,
    VariantCapacity,
    measure_variant,
    measured_capacity,
    profile_of,
    rung_capacities,
    save_profile,
    synthetic_feeds,
)
from graylane.engine.signature import IOSignature, TensorSpec


class SleepyEngine:
    """2 ms per call plus 1 ms per row: batching pays."""

    io = IOSignature(
        inputs=(
            TensorSpec("input_ids", np.int64, ("batch", "seq")),
            TensorSpec("attention_mask", np.int64, ("batch", "seq")),
        ),
        outputs=(TensorSpec("logits", np.float32, ("batch", "seq", 8)),),
    )

    def __init__(self) -> None:
        self.shapes: list[tuple[int, ...]] = []

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        rows, seq = feeds["input_ids"].shape
        self.shapes.append((rows, seq))
        time.sleep((2 + rows) / 1000)
        return {"logits": np.zeros((rows, seq, 8), np.float32)}

    def close(self) -> None:
        pass


def test_measure_variant_times_each_batch_size() -> None:
    engine = SleepyEngine()
    cap = measure_variant(engine, "fp32", seq_len=16, batches=(1, 8), seconds_per_point=0.05)  # type: ignore[arg-type]
    assert [p.batch for p in cap.points] == [1, 8]
    assert {shape for shape in engine.shapes} == {(1, 16), (8, 16)}
    assert cap.points[0].service_ms >= 3 and cap.points[1].service_ms >= 10
    assert cap.rps(8) > cap.rps(1)  # sub-linear cost: a batch serves more per second
    assert cap.rps() == cap.rps(8)


def test_synthetic_feeds_match_the_signature() -> None:
    feeds = synthetic_feeds(SleepyEngine.io.inputs, 3, 5)
    assert feeds["input_ids"].shape == (3, 5) and feeds["input_ids"].dtype == np.int64
    assert (feeds["attention_mask"] == 1).all()


def profile(host: str) -> CapacityProfile:
    v = VariantCapacity("fp32", 64, (BatchPoint(1, 10.0), BatchPoint(8, 40.0)))
    return CapacityProfile("m", "1.0.0", host, 1, 1, (v,))


def test_round_trip_and_measured_capacity_on_this_host(tmp_path: Path) -> None:
    here = profile_of("m", "1.0.0", profile("x").variants, threads=1)
    save_profile(tmp_path, here)
    assert CapacityProfile.from_json(here.to_json()) == here
    assert measured_capacity(tmp_path, "m", "1.0.0") == pytest.approx(200.0)
    assert measured_capacity(tmp_path, "m", "1.0.0", batch=1) == pytest.approx(100.0)
    assert measured_capacity(tmp_path, "m", "1.0.0", "int8-dynamic") is None
    assert measured_capacity(tmp_path, "m", "2.0.0") is None


def test_a_figure_from_another_host_is_not_used(tmp_path: Path) -> None:
    save_profile(tmp_path, profile("some-other-machine"))
    assert measured_capacity(tmp_path, "m", "1.0.0") is None
    assert measured_capacity(tmp_path, "m", "1.0.0", host="some-other-machine") == pytest.approx(
        200.0
    )


def test_malformed_profiles_and_unmeasured_batches_are_errors() -> None:
    with pytest.raises(CapacityError):
        CapacityProfile.from_json('{"model": "m"}')
    with pytest.raises(CapacityError):
        profile("h").variant("fp32").rps(4)
    with pytest.raises(CapacityError):
        profile("h").variant("fp16")


def test_rung_capacities_for_a_qos_policy() -> None:
    fp32 = VariantCapacity("fp32", 64, (BatchPoint(1, 50.0), BatchPoint(8, 200.0)))
    int8 = VariantCapacity("int8-dynamic", 64, (BatchPoint(1, 25.0),))
    never = VariantCapacity("fp16", 64, ())
    profile = CapacityProfile("m", "1.0.0", "h", 1, 1, (fp32, int8, never))
    # the best batch of each calibrated rung on the ladder; rungs off the ladder left out
    assert rung_capacities(profile, ("fp32", "fp16", "int8-dynamic")) == (
        ("fp32", 40.0),
        ("int8-dynamic", 40.0),
    )
    assert rung_capacities(profile, ("fp32",)) == (("fp32", 40.0),)
