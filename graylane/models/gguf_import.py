"""A GGUF file (llama.cpp's format) as an ONNX decoder export folder, without torch.

Most open LLMs are distributed as GGUF. :func:`import_gguf` reads one with the ``gguf``
library, dequantizes its weights to float32 (``gguf.quants.dequantize``: what
transformers' own GGUF loader does) and writes the folder an Optimum export would be:

- ``model.onnx``: the decoder with past (:mod:`graylane.models.llama_graph`);
- ``tokenizer.json``: the GGUF's tokenizer (:mod:`graylane.models.gguf_tokenizer`);
- ``tokenizer_config.json``: the chat template and the special tokens, as transformers
  saves them (what ``graylane gateway --chat-template`` reads);
- ``config.json`` / ``generation_config.json``: the shape, the context length and the
  BOS/EOS ids (what the builder and worker read beside a model);
- ``import.json``: the GGUF's sha256 and what was imported.

Only the Llama family is imported (``general.architecture: llama``: RMSNorm, RoPE,
grouped-query attention, SwiGLU, tied or separate output head). Anything else (another
architecture, experts, RoPE scaling, partial rotary dimensions, unexpected tensors) is
refused with :class:`GgufImportError` saying what, never converted approximately.

llama.cpp's converter permutes the rows of the query and key projections for its own
(interleaved) rotary form; the import undoes it (transformers' ``reverse_permute``) so
the graph uses the half-rotation form.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from graylane.errors import GraylaneError

__all__ = [
    "CONFIG_FILE",
    "GENERATION_CONFIG_FILE",
    "IMPORTER_VERSION",
    "IMPORT_RECORD",
    "MODEL_FILE",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "GgufImport",
    "GgufImportError",
    "GgufModel",
    "import_gguf",
    "read_gguf",
    "read_import",
]

IMPORTER_VERSION = "1"
"""Bumped whenever the written graph or files change: it keys the builder's cache."""
MODEL_FILE = "model.onnx"
TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
IMPORT_RECORD = "import.json"
_EXTERNAL_THRESHOLD = 1_500_000_000

_LAYER_TENSORS = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_BLOCK = re.compile(r"blk\.(\d+)\.(\w+)\.weight")


class GgufImportError(GraylaneError, ValueError):
    """The GGUF file cannot be imported; the message says what it holds and what is missing."""


@dataclass(frozen=True)
class GgufModel:
    """A GGUF file read: its metadata, tensors by llama.cpp name, and what they make."""

    path: Path
    fields: Mapping[str, Any]
    tensors: Mapping[str, Any]
    """llama.cpp tensor name -> the reader's tensor (quantized data, type, shape)."""

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", "?"))

    def config(self) -> Any:
        """The decoder's shape (:class:`~graylane.models.llama_graph.LlamaConfig`), or
        :class:`GgufImportError` for anything but a plain Llama-family model."""
        from graylane.models.llama_graph import LlamaConfig

        arch = self.architecture
        if arch != "llama":
            raise GgufImportError(
                f"{self.path.name}: architecture {arch!r} is not supported; only the Llama "
                "family (general.architecture 'llama': RMSNorm, RoPE, grouped-query attention, "
                "SwiGLU) is imported"
            )
        f = self.fields

        def need(key: str) -> Any:
            value = f.get(f"llama.{key}")
            if value is None:
                raise GgufImportError(f"{self.path.name}: llama.{key} is missing")
            return value

        if f.get("llama.expert_count"):
            raise GgufImportError(f"{self.path.name}: mixture-of-experts models are not imported")
        scaling = f.get("llama.rope.scaling.type")
        if scaling not in (None, "none") or "rope_freqs.weight" in self.tensors:
            raise GgufImportError(
                f"{self.path.name}: RoPE scaling ({scaling or 'rope_freqs'}) is not imported"
            )
        hidden = int(need("embedding_length"))
        heads = int(need("attention.head_count"))
        kv_heads = int(f.get("llama.attention.head_count_kv", heads))
        head_dim = int(f.get("llama.attention.key_length", hidden // heads))
        rotary = int(f.get("llama.rope.dimension_count", head_dim))
        if rotary != head_dim:
            raise GgufImportError(
                f"{self.path.name}: rotary dimensions {rotary} != head size {head_dim} "
                "(partial rotary embeddings are not imported)"
            )
        embed = self.tensors.get("token_embd.weight")
        if embed is None:
            raise GgufImportError(f"{self.path.name}: no token_embd.weight tensor")
        vocab = int(f.get("llama.vocab_size") or embed.shape[-1])
        self._check_tensors(int(need("block_count")))
        return LlamaConfig(
            vocab_size=vocab,
            hidden_size=hidden,
            intermediate_size=int(need("feed_forward_length")),
            num_hidden_layers=int(need("block_count")),
            num_attention_heads=heads,
            num_key_value_heads=kv_heads,
            head_dim=head_dim,
            rope_theta=float(f.get("llama.rope.freq_base", 10000.0)),
            rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
            max_position_embeddings=int(need("context_length")),
            tie_word_embeddings="output.weight" not in self.tensors,
        )

    def _check_tensors(self, layers: int) -> None:
        unknown = []
        for name in self.tensors:
            block = _BLOCK.fullmatch(name)
            if (
                block is not None
                and block.group(2) in _LAYER_TENSORS
                and int(block.group(1)) < layers
            ):
                continue
            if name.endswith(".weight") and name[: -len(".weight")] in _GLOBAL_TENSORS:
                continue
            unknown.append(name)
        if unknown:
            raise GgufImportError(
                f"{self.path.name}: tensors a plain Llama decoder does not have: "
                f"{sorted(unknown)[:8]}{' …' if len(unknown) > 8 else ''}"
            )
        missing = [
            f"blk.{i}.{t}.weight"
            for i in range(layers)
            for t in _LAYER_TENSORS
            if f"blk.{i}.{t}.weight" not in self.tensors
        ]
        if "output_norm.weight" not in self.tensors:
            missing.append("output_norm.weight")
        if missing:
            raise GgufImportError(f"{self.path.name}: missing tensors {missing[:8]}")

    def weights(self) -> Callable[[str], np.ndarray]:
        """Float32 weights by transformers name (``[out, in]`` for projections)."""
        config = self.config()
        by_hf: dict[str, str] = {
            f"{hf}.weight": f"{gg}.weight" for gg, hf in _GLOBAL_TENSORS.items()
        }
        for i in range(config.num_hidden_layers):
            for gg, hf in _LAYER_TENSORS.items():
                by_hf[f"model.layers.{i}.{hf}.weight"] = f"blk.{i}.{gg}.weight"

        def weight(name: str) -> np.ndarray:
            array = self.dequantized(by_hf[name])
            if name.endswith("self_attn.q_proj.weight"):
                array = _reverse_permute(array, config.num_attention_heads)
            elif name.endswith("self_attn.k_proj.weight"):
                array = _reverse_permute(array, config.num_key_value_heads)
            return array

        return weight

    def dequantized(self, name: str) -> np.ndarray:
        """One tensor as float32 in numpy's row-major order (``[out, in]``)."""
        from gguf.quants import dequantize

        tensor = self.tensors[name]
        array = dequantize(tensor.data, tensor.tensor_type)
        shape = tuple(int(d) for d in reversed(tensor.shape))  # ggml lists ne0 (the row) first
        return np.ascontiguousarray(array.reshape(shape), dtype=np.float32)


def _reverse_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's row order of a query/key projection (interleaved rotary pairs)."""
    rows = weight.shape[0]
    half = rows // heads // 2
    return weight.reshape(heads, half, 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)


def read_gguf(path: Path) -> GgufModel:
    """Open a GGUF file (memory-mapped) and decode its metadata."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # the reader raises plain ValueErrors and struct errors
        raise GgufImportError(f"{path}: not a readable GGUF file: {exc}") from exc
    fields: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        try:
            fields[key] = field.contents()
        except Exception:  # a value type this reader cannot decode: not one we read
            continue
    tensors = {t.name: t for t in reader.tensors}
    return GgufModel(path=path, fields=fields, tensors=tensors)


@dataclass(frozen=True)
class GgufImport:
    """An imported folder and what it holds."""

    folder: Path
    model: Path
    tokenizer: Path
    tokenizer_config: Path
    config: Any
    """The decoder's :class:`~graylane.models.llama_graph.LlamaConfig`."""
    source_sha256: str
    eos_id: int | None
    bos_id: int | None
    duration_s: float
    cache_hit: bool = False
    """Read back from a folder imported earlier (:func:`read_import`)."""


def read_import(folder: Path) -> GgufImport | None:
    """A folder :func:`import_gguf` completed, read back; ``None`` if it is not one."""
    from graylane.models.llama_graph import LlamaConfig

    record_path, config_path = folder / IMPORT_RECORD, folder / CONFIG_FILE
    if not (record_path.is_file() and config_path.is_file() and (folder / MODEL_FILE).is_file()):
        return None
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        hf = json.loads(config_path.read_text(encoding="utf-8"))
        generation = json.loads((folder / GENERATION_CONFIG_FILE).read_text(encoding="utf-8"))
        config = LlamaConfig(**{k: hf[k] for k in LlamaConfig.__dataclass_fields__})
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if record.get("importer_version") != IMPORTER_VERSION:
        return None
    return GgufImport(
        folder=folder,
        model=folder / MODEL_FILE,
        tokenizer=folder / TOKENIZER_FILE,
        tokenizer_config=folder / TOKENIZER_CONFIG_FILE,
        config=config,
        source_sha256=str(record["source_sha256"]),
        eos_id=generation.get("eos_token_id"),
        bos_id=generation.get("bos_token_id"),
        duration_s=float(record.get("duration_s", 0.0)),
        cache_hit=True,
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def import_gguf(
    source: Path,
    folder: Path,
    *,
    source_sha256: str | None = None,
    say: Callable[[str], None] = lambda _: None,
) -> GgufImport:
    """Write the export folder of ``source`` into ``folder`` (see the module doc)."""
    import onnx

    from graylane.models.gguf_tokenizer import GgufTokenizerError, GgufVocab, tokenizer_from_gguf
    from graylane.models.llama_graph import build_llama_decoder

    started = time.perf_counter()
    gguf_model = read_gguf(source)
    config = gguf_model.config()
    try:
        vocab = GgufVocab.from_fields(gguf_model.fields)
        tokenizer = tokenizer_from_gguf(vocab)
    except GgufTokenizerError as exc:
        raise GgufImportError(f"{source.name}: {exc}") from None
    if len(vocab.tokens) > config.vocab_size:
        raise GgufImportError(
            f"{source.name}: {len(vocab.tokens)} tokens for an embedding of {config.vocab_size}"
        )
    digest = source_sha256 or sha256_of(source)
    say(
        f"importing {source.name}: llama, {config.num_hidden_layers} layers, width "
        f"{config.hidden_size}, {config.num_attention_heads}/{config.num_key_value_heads} heads, "
        f"vocabulary {config.vocab_size}"
    )
    folder.mkdir(parents=True, exist_ok=True)
    metadata = {
        "graylane.task": "causal-lm",
        "graylane.vocab_size": str(config.vocab_size),
        "graylane.max_seq_len": str(config.max_position_embeddings),
        "graylane.source.gguf_sha256": digest,
        "graylane.source.gguf_name": str(gguf_model.fields.get("general.name", source.stem)),
    }
    model = build_llama_decoder(config, gguf_model.weights(), metadata=metadata)
    model_path = folder / MODEL_FILE
    size = sum(len(t.raw_data) for t in model.graph.initializer)
    if size > _EXTERNAL_THRESHOLD:
        onnx.save_model(
            model,
            str(model_path),
            save_as_external_data=True,
            all_tensors_to_one_file=True,
            location=MODEL_FILE + ".data",
        )
    else:
        onnx.save_model(model, str(model_path))
    del model
    tokenizer_path = folder / TOKENIZER_FILE
    tokenizer.save(str(tokenizer_path))
    _write_json(folder / TOKENIZER_CONFIG_FILE, _tokenizer_config(vocab, gguf_model.fields, config))
    _write_json(folder / CONFIG_FILE, {**config.hf_config(), **_special_ids(vocab)})
    _write_json(folder / GENERATION_CONFIG_FILE, _special_ids(vocab))
    duration = time.perf_counter() - started
    _write_json(
        folder / IMPORT_RECORD,
        {
            "importer_version": IMPORTER_VERSION,
            "source": source.name,
            "source_sha256": digest,
            "architecture": "llama",
            "file_type": gguf_model.fields.get("general.file_type"),
            "tensor_types": sorted({t.tensor_type.name for t in gguf_model.tensors.values()}),
            "duration_s": round(duration, 2),
        },
    )
    return GgufImport(
        folder=folder,
        model=model_path,
        tokenizer=tokenizer_path,
        tokenizer_config=folder / TOKENIZER_CONFIG_FILE,
        config=config,
        source_sha256=digest,
        eos_id=vocab.eos_id,
        bos_id=vocab.bos_id,
        duration_s=duration,
    )


def _special_ids(vocab: Any) -> dict[str, int]:
    ids = {"bos_token_id": vocab.bos_id, "eos_token_id": vocab.eos_id, "pad_token_id": vocab.pad_id}
    return {k: int(v) for k, v in ids.items() if v is not None}


def _tokenizer_config(vocab: Any, fields: Mapping[str, Any], config: Any) -> dict[str, Any]:
    """transformers' ``tokenizer_config.json``: the chat template and special tokens."""
    out: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": config.max_position_embeddings,
        "add_bos_token": vocab.add_bos,
        "add_eos_token": vocab.add_eos,
        "clean_up_tokenization_spaces": False,
    }
    for key, token_id in (
        ("bos_token", vocab.bos_id),
        ("eos_token", vocab.eos_id),
        ("unk_token", vocab.unk_id),
        ("pad_token", vocab.pad_id),
    ):
        text = vocab.token(token_id)
        if text is not None:
            out[key] = text
    template = fields.get("tokenizer.chat_template")
    if isinstance(template, str) and template:
        out["chat_template"] = template
    return out


def _write_json(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
