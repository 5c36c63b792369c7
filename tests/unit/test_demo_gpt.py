from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from numpy.typing import ArrayLike

from graylane.models import demo_gpt as gpt
from graylane.models.byte_vocab import (
    BOS_ID,
    EOS_ID,
    VOCAB_SIZE,
    DemoModelError,
    decode_tokens,
    encode_text,
)
from graylane.models.demo_gpt import (
    DemoModelInfo,
    DemoSize,
    build_demo_gpt,
    config_for,
    count_parameters,
    write_demo_gpt,
)


@pytest.fixture(scope="module")
def tiny() -> onnx.ModelProto:
    return build_demo_gpt("tiny", seed=0)


@pytest.fixture(scope="module")
def session(tiny: onnx.ModelProto) -> ort.InferenceSession:
    return ort.InferenceSession(tiny.SerializeToString(), providers=["CPUExecutionProvider"])


def logits(
    session: ort.InferenceSession, tokens: ArrayLike, mask: ArrayLike | None = None
) -> np.ndarray:
    ids = np.atleast_2d(np.asarray(tokens, dtype=np.int64))
    keep = np.ones_like(ids) if mask is None else np.atleast_2d(np.asarray(mask, dtype=np.int64))
    out: np.ndarray = session.run(["logits"], {"input_ids": ids, "attention_mask": keep})[0]
    return out


def test_tiny_passes_the_checker_and_declares_its_io(tiny: onnx.ModelProto) -> None:
    onnx.checker.check_model(tiny, full_check=True)
    assert [i.name for i in tiny.graph.input] == ["input_ids", "attention_mask"]
    assert [o.name for o in tiny.graph.output] == ["logits"]
    assert tiny.opset_import[0].version >= 17
    dims = [d.dim_param or d.dim_value for d in tiny.graph.output[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "seq", VOCAB_SIZE]


def test_metadata_records_size_seed_and_special_ids(tiny: onnx.ModelProto) -> None:
    info = DemoModelInfo.from_model(tiny)
    assert info == DemoModelInfo(
        size=DemoSize.TINY,
        seed=0,
        vocab_size=VOCAB_SIZE,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        pad_id=gpt.PAD_ID,
        max_seq_len=256,
    )


def test_metadata_of_a_foreign_model_is_refused() -> None:
    with pytest.raises(DemoModelError):
        DemoModelInfo.from_model(onnx.ModelProto())


def test_parameter_counts_match_config_and_target_sizes(tiny: onnx.ModelProto) -> None:
    assert count_parameters(tiny) == config_for("tiny").parameter_count()
    assert 100_000 < count_parameters(tiny) < 1_500_000  # a few MB of float32
    small = build_demo_gpt(DemoSize.SMALL, seed=0)
    onnx.checker.check_model(small, full_check=True)
    assert count_parameters(small) == config_for("small").parameter_count()
    assert 10_000_000 <= count_parameters(small) <= 20_000_000
    assert DemoModelInfo.from_model(small).max_seq_len == 512


def test_same_seed_gives_same_bytes_and_another_seed_differs() -> None:
    first = build_demo_gpt("tiny", seed=7).SerializeToString()
    assert build_demo_gpt("tiny", seed=7).SerializeToString() == first
    assert build_demo_gpt("tiny", seed=8).SerializeToString() != first


def test_unknown_size_is_refused() -> None:
    with pytest.raises(DemoModelError, match="huge"):
        build_demo_gpt("huge")


def test_write_demo_gpt_creates_a_loadable_file(tmp_path: Path) -> None:
    path = write_demo_gpt(tmp_path / "models" / "tiny.onnx", "tiny", seed=3)
    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    out = logits(sess, encode_text("hi", add_bos=True))
    assert out.shape == (1, 3, VOCAB_SIZE)
    assert out.dtype == np.float32


def test_causal_later_tokens_do_not_change_earlier_logits(session: ort.InferenceSession) -> None:
    base = np.array(encode_text("causal check!", add_bos=True))
    changed = base.copy()
    changed[8:] = np.array(encode_text("zzzzzz"))[: len(base) - 8]
    a, b = logits(session, base), logits(session, changed)
    np.testing.assert_allclose(a[0, :8], b[0, :8], atol=1e-5)
    assert not np.allclose(a[0, 8:], b[0, 8:], atol=1e-3)


def test_right_padding_leaves_real_positions_unchanged(session: ort.InferenceSession) -> None:
    ids = np.array(encode_text("padding", add_bos=True))
    padded = np.concatenate([ids, np.full(5, 99)])
    mask = np.concatenate([np.ones_like(ids), np.zeros(5, dtype=np.int64)])
    np.testing.assert_allclose(
        logits(session, padded, mask)[0, : len(ids)], logits(session, ids)[0], atol=1e-5
    )


def test_masked_keys_are_ignored(session: ort.InferenceSession) -> None:
    ids = np.array([BOS_ID, 10, 20, 30, 40])
    mask = np.array([1, 1, 0, 1, 1])
    other = ids.copy()
    other[2] = 200
    np.testing.assert_allclose(
        logits(session, ids, mask)[0, 3:], logits(session, other, mask)[0, 3:], atol=1e-5
    )


def test_logits_vary_and_greedy_generation_is_not_constant(session: ort.InferenceSession) -> None:
    seq = encode_text("Hello", add_bos=True)
    for _ in range(24):
        seq.append(int(logits(session, np.array(seq))[0, -1].argmax()))
    generated = seq[6:]
    assert len(set(generated)) > 4
    out = logits(session, np.array(encode_text("abcdef")))
    assert out.std() > 0.1
    assert len(set(out[0].argmax(axis=-1).tolist())) > 1


def test_text_round_trip_through_byte_tokens() -> None:
    text = "héllo, wörld ✓"
    tokens = encode_text(text, add_bos=True)
    assert tokens[0] == BOS_ID
    assert all(0 <= t < 256 for t in tokens[1:])
    assert decode_tokens([*tokens, EOS_ID]) == text


def test_decode_refuses_ids_outside_the_vocabulary() -> None:
    with pytest.raises(DemoModelError):
        decode_tokens([65, VOCAB_SIZE])


# --- decoder-with-past export -------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_kv() -> onnx.ModelProto:
    return build_demo_gpt("tiny", seed=0, kv_cache=True)


def _dims(value: onnx.ValueInfoProto) -> list[str | int]:
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


def test_default_export_has_no_cache_and_kv_export_follows_the_optimum_names(
    tiny: onnx.ModelProto, tiny_kv: onnx.ModelProto
) -> None:
    assert build_demo_gpt("tiny", seed=0, kv_cache=False).SerializeToString() == (
        tiny.SerializeToString()
    )
    assert not DemoModelInfo.from_model(tiny).kv_cache
    onnx.checker.check_model(tiny_kv, full_check=True)
    assert DemoModelInfo.from_model(tiny_kv).kv_cache
    inputs = {i.name: _dims(i) for i in tiny_kv.graph.input}
    outputs = {o.name: _dims(o) for o in tiny_kv.graph.output}
    past = {f"past_key_values.{i}.{k}" for i in range(2) for k in ("key", "value")}
    present = {f"present.{i}.{k}" for i in range(2) for k in ("key", "value")}
    assert set(inputs) == {"input_ids", "attention_mask"} | past
    assert set(outputs) == {"logits"} | present
    assert inputs["attention_mask"] == ["batch", "total_seq"]
    assert inputs["past_key_values.1.value"] == ["batch", 4, "past_seq", 32]
    assert outputs["present.0.key"] == ["batch", 4, "total_seq", 32]
    assert outputs["logits"] == ["batch", "seq", VOCAB_SIZE]
    # Same weights, drawn from the same seed.
    weights = {i.name: i for i in tiny.graph.initializer}
    for init in tiny_kv.graph.initializer:
        if init.name in ("wte", "wpe", "lm_head.weight", "h1.mlp.fc_out.weight"):
            assert init == weights[init.name]


def test_prefill_then_incremental_steps_give_the_full_model_logits(
    session: ort.InferenceSession, tiny_kv: onnx.ModelProto
) -> None:
    kv = ort.InferenceSession(tiny_kv.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in kv.get_outputs()]
    long = np.array(encode_text("a longer prompt", add_bos=True))
    short = np.array(encode_text("short", add_bos=True))
    full_long, full_short = logits(session, long)[0], logits(session, short)[0]
    # Prefill both rows (right-padded) with an empty past, then feed one token at a time:
    # the short row keeps its padding columns as holes in its cache.
    prefill = 4
    ids = np.stack([long[:prefill], short[:prefill]])
    mask = np.ones_like(ids)
    past = {
        f"past_key_values.{i}.{k}": np.zeros((2, 4, 0, 32), np.float32)
        for i in range(2)
        for k in ("key", "value")
    }

    def run(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return dict(zip(names, kv.run(None, feeds), strict=True))

    out = run({"input_ids": ids, "attention_mask": mask, **past})
    np.testing.assert_allclose(out["logits"][0], full_long[:prefill], atol=1e-4)
    for step in range(prefill, len(long)):
        real_short = step < len(short)
        new = np.array([[long[step]], [short[step] if real_short else gpt.PAD_ID]])
        mask = np.concatenate([mask, [[1], [int(real_short)]]], axis=1)
        past = {n.replace("present", "past_key_values"): v for n, v in out.items() if n != "logits"}
        out = run({"input_ids": new, "attention_mask": mask, **past})
        assert out["present.0.key"].shape == (2, 4, step + 1, 32)
        np.testing.assert_allclose(out["logits"][0, 0], full_long[step], atol=1e-4)
        if real_short:
            np.testing.assert_allclose(out["logits"][1, 0], full_short[step], atol=1e-4)
