"""Warm-up shapes and batching buckets come from the IO signature and the build profiles,
not from the demo's input names."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from graylane.artifacts.build_info import InputShapeRange, ShapeProfile
from graylane.artifacts.model_info import ModelInfo, ModelTask
from graylane.engine.errors import BadShape
from graylane.engine.signature import IOSignature, TensorSpec
from graylane.engine_worker.compute import (
    profile_buckets,
    profile_max_batch,
    warm_up,
    warm_up_feeds,
)
from graylane.engine_worker.logic.batching import DEFAULT_BUCKETS, BucketPolicy

POLICY = BucketPolicy(buckets=(8, 16, 32), max_batch_size=4)

IMAGES = IOSignature(
    inputs=(
        TensorSpec("pixels", np.dtype(np.float32), ("n", 3, "h", "w")),
        TensorSpec("scale", np.dtype(np.float32), ("n", 1)),
    ),
    outputs=(TensorSpec("scores", np.dtype(np.float32), ("n", 10)),),
)
TOKENS = IOSignature(
    inputs=(
        TensorSpec("input_ids", np.dtype(np.int32), ("batch", "seq")),
        TensorSpec("attention_mask", np.dtype(np.int64), ("batch", "seq")),
    ),
    outputs=(TensorSpec("out", np.dtype(np.float32), ("batch", "seq", 4)),),
)


def _profile(name: str, **shapes: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]):  # type: ignore[no-untyped-def]
    return ShapeProfile(
        name, tuple(InputShapeRange(k, lo, opt, hi) for k, (lo, opt, hi) in shapes.items())
    )


class Recorder:
    """An engine that records the shapes it ran; refuses one shape if told to."""

    def __init__(self, io: IOSignature, variant: str, refuse: tuple[int, ...] | None = None):
        self._io, self._variant, self._refuse = io, variant, refuse
        self.ran: list[dict[str, tuple[int, ...]]] = []

    @property
    def io(self) -> IOSignature:
        return self._io

    @property
    def name(self) -> str:
        return "m"

    @property
    def variant(self) -> str:
        return self._variant

    def run(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        checked = self._io.check_feeds(feeds)
        shapes = {k: tuple(v.shape) for k, v in checked.items()}
        first = next(iter(shapes.values()))
        if first == self._refuse:
            raise BadShape(f"shape {first} is outside this engine's profiles")
        self.ran.append(shapes)
        return {o.name: np.zeros((1,), np.float32) for o in self._io.outputs}

    def close(self) -> None:
        pass


def test_every_profile_opt_shape_is_warmed_for_every_variant_whatever_the_input_names() -> None:
    profiles = (
        _profile("small", pixels=((1, 3, 32, 32), (2, 3, 64, 64), (4, 3, 64, 64))),
        _profile("large", pixels=((1, 3, 64, 64), (1, 3, 224, 224), (2, 3, 256, 256))),
    )
    engines = [Recorder(IMAGES, "fp32"), Recorder(IMAGES, "int8")]
    assert warm_up(engines, POLICY, 32, profiles) == 4
    for engine in engines:
        # "scale" is not in the profile: its symbolic batch axis follows the profile's.
        assert engine.ran == [
            {"pixels": (2, 3, 64, 64), "scale": (2, 1)},
            {"pixels": (1, 3, 224, 224), "scale": (1, 1)},
        ]


def test_without_profiles_a_generic_model_warms_once_and_a_token_model_per_bucket() -> None:
    generic = Recorder(IMAGES, "fp32")
    assert warm_up([generic], POLICY, 32) == 1
    assert generic.ran == [{"pixels": (1, 3, 1, 1), "scale": (1, 1)}]
    tokens = Recorder(TOKENS, "fp32")
    assert warm_up([tokens], POLICY, 16) == 2  # buckets up to max_seq_len
    assert [r["input_ids"] for r in tokens.ran] == [(1, 8), (1, 16)]
    feeds = warm_up_feeds(TOKENS, (), (8,), 8)
    assert feeds[0]["input_ids"].dtype == np.int32 and feeds[0]["attention_mask"].min() == 1


def test_a_shape_an_engine_refuses_is_skipped_not_fatal() -> None:
    profiles = (
        _profile("a", input_ids=((1, 1), (4, 16), (8, 32))),
        _profile("b", input_ids=((1, 32), (2, 64), (4, 128))),
    )
    engine = Recorder(TOKENS, "fp16", refuse=(2, 64))
    assert warm_up([engine], POLICY, 128, profiles) == 1
    assert engine.ran == [{"input_ids": (4, 16), "attention_mask": (4, 16)}]


def test_buckets_and_batch_cap_follow_the_profiles() -> None:
    profiles = (
        _profile("short", input_ids=((1, 1), (8, 32), (16, 64))),
        _profile("long", input_ids=((1, 64), (2, 256), (4, 512))),
    )
    assert profile_buckets(profiles, None, 512) == (32, 64, 256, 512)
    assert profile_buckets(profiles, None, 256) == (32, 64, 256)
    assert profile_buckets((), None, 256) is None
    tagger = ModelInfo(ModelTask.TOKEN_CLASSIFICATION, 54, "tokens")
    renamed = (_profile("p", tokens=((1, 1), (4, 24), (8, 48))),)
    assert profile_buckets(renamed, tagger, 64) == (24, 48)
    assert profile_buckets(profiles, tagger, 512) is None  # no profile for "tokens"
    assert profile_max_batch(profiles) == 16
    assert profile_max_batch(()) is None


def test_the_worker_batches_with_the_profiles_buckets_and_warms_their_shapes() -> None:
    from graylane.engine_worker.config import WorkerConfig
    from graylane.engine_worker.service import Worker
    from tests.support.memory_kafka import MemoryBroker, MemoryFactory

    profiles = (
        _profile("short", input_ids=((1, 1), (4, 16), (8, 32))),
        _profile("long", input_ids=((1, 32), (2, 96), (4, 128))),
    )
    engines = {"fp32": Recorder(TOKENS, "fp32"), "fp16": Recorder(TOKENS, "fp16")}
    config = WorkerConfig(
        model="m",
        version="v1",
        initial_variant="fp32",
        max_seq_len=128,
        buckets=(8, 16, 32, 64, 128),
        profiles=profiles,
        metrics_port=-1,
    )
    worker = Worker(MemoryFactory(MemoryBroker()), config, engines)  # type: ignore[arg-type]
    assert worker.backend.policy.buckets == (16, 32, 96, 128)
    assert worker.backend.warm_up_now() == 4
    for engine in engines.values():
        assert [r["input_ids"] for r in engine.ran] == [(4, 16), (2, 96)]
    plain = Worker(
        MemoryFactory(MemoryBroker()),
        WorkerConfig(model="m", version="v1", initial_variant="fp32", metrics_port=-1),
        {"fp32": Recorder(TOKENS, "fp32")},  # type: ignore[dict-item]
    )
    assert plain.backend.policy.buckets == DEFAULT_BUCKETS  # no profiles: the configured buckets
