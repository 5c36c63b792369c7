"""Calibration and validation samples: read from .npz files or made by named generators."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from graylane.builder.runtime import derived_inputs
from graylane.builder.spec import DataSpec, Generator, GeneratorData, NpzData
from graylane.engine.signature import DECODER_INPUTS, IOSignature, TensorSpec
from graylane.errors import GraylaneError

__all__ = ["SampleError", "SampleSet", "continued", "demo_sentences", "load_samples"]

Feeds = Mapping[str, np.ndarray]


class SampleError(GraylaneError, ValueError):
    """Samples cannot be read or do not fit the model's inputs."""


@dataclass(frozen=True)
class SampleSet:
    """Model feeds in batches, with a digest of their exact content."""

    batches: tuple[Feeds, ...]
    digest: str
    labels: tuple[np.ndarray, ...] | None = None
    """Per batch, the expected class of each row (``labels`` in the .npz), when given:
    shape ``[batch]`` (one class per sample) or ``[batch, seq]`` (one per position)."""
    score_masks: tuple[np.ndarray, ...] | None = None
    """Per batch, the positions a variant is judged on, when not every real one: for
    prompts continued by fp32, the positions that predict the continuation."""
    description: str = ""
    """What the samples are, for the report (a prompts file, random tokens, ...)."""

    @property
    def count(self) -> int:
        """Number of samples (rows along axis 0 of the first input)."""
        return sum(int(next(iter(b.values())).shape[0]) for b in self.batches if b)

    def __iter__(self) -> Iterator[Feeds]:
        return iter(self.batches)

    def rows(self) -> Iterator[Feeds]:
        """Each sample as its own batch of one."""
        for batch in self.batches:
            n = int(next(iter(batch.values())).shape[0])
            for i in range(n):
                yield {k: v[i : i + 1] for k, v in batch.items()}


def _content_digest(batches: tuple[Feeds, ...]) -> str:
    sha = hashlib.sha256()
    for batch in batches:
        for name in sorted(batch):
            array = np.ascontiguousarray(batch[name])
            sha.update(f"{name}|{array.dtype.str}|{array.shape}|".encode())
            sha.update(array.tobytes())
    return sha.hexdigest()


def _batched(columns: Mapping[str, np.ndarray], batch_size: int) -> tuple[Feeds, ...]:
    total = int(next(iter(columns.values())).shape[0])
    return tuple(
        {k: np.ascontiguousarray(v[i : i + batch_size]) for k, v in columns.items()}
        for i in range(0, total, batch_size)
    )


def load_samples(spec: DataSpec, signature: IOSignature, max_seq_len: int | None) -> SampleSet:
    """Materialize the samples a :class:`DataSpec` describes for a model's inputs."""
    labels: tuple[np.ndarray, ...] | None = None
    if isinstance(spec.source, NpzData):
        columns = _from_npz(spec.source, spec.samples, signature)
        label_column = _labels_from_npz(spec.source, spec.samples)
        if label_column is not None:
            labels = tuple(
                label_column[i : i + spec.batch_size]
                for i in range(0, len(label_column), spec.batch_size)
            )
    else:
        columns = _generate(spec.source, spec.samples, spec.seed, signature, max_seq_len)
    batches = _batched(columns, spec.batch_size)
    return SampleSet(
        batches=batches, digest=_content_digest(batches), labels=labels, description=_describe(spec)
    )


def _describe(spec: DataSpec) -> str:
    source = spec.source
    if isinstance(source, NpzData):
        return f"{spec.samples} samples from {source.path.name}"
    if source.generator is Generator.PROMPTS and source.prompts is not None:
        return f"{spec.samples} prompts of {source.prompts.name} (real text)"
    if source.generator is Generator.RANDOM:
        return f"{spec.samples} random samples (fallback: no validation data named)"
    return f"{spec.samples} samples of the '{source.generator.value}' generator"


def continued(samples: SampleSet, continuations: Sequence[Sequence[int]]) -> SampleSet:
    """Each row's prompt followed by its continuation (fp32's greedy tokens), judged on the
    positions that predict the continuation: the text the reference writes, forced.

    ``continuations`` are in row order; rows are right-padded to the longest.
    """
    rows = list(samples.rows())
    if len(rows) != len(continuations):
        raise SampleError(f"{len(continuations)} continuations for {len(rows)} samples")
    ids_name, mask_name = DECODER_INPUTS
    full: list[list[int]] = []
    starts: list[int] = []
    for row, extra in zip(rows, continuations, strict=True):
        prompt = [int(t) for t in row[ids_name][0][row[mask_name][0].astype(bool)]]
        full.append(prompt + [int(t) for t in extra])
        starts.append(len(prompt) - 1)
    width = max(len(r) for r in full)
    ids = np.zeros((len(full), width), dtype=np.int64)
    mask = np.zeros((len(full), width), dtype=np.int64)
    score = np.zeros((len(full), width), dtype=np.int64)
    for i, (tokens, start) in enumerate(zip(full, starts, strict=True)):
        ids[i, : len(tokens)] = tokens
        mask[i, : len(tokens)] = 1
        score[i, start : len(tokens) - 1] = 1
    batch_size = int(next(iter(samples.batches[0].values())).shape[0]) if samples.batches else 1
    batches = _batched({ids_name: ids, mask_name: mask}, batch_size)
    masks = tuple(score[i : i + batch_size] for i in range(0, len(full), batch_size))
    return SampleSet(
        batches=batches,
        digest=_content_digest(batches),
        score_masks=masks,
        description=f"{samples.description}, each continued by fp32's "
        f"{max((len(c) for c in continuations), default=0)} greedy tokens (judged on those)",
    )


LABELS = "labels"
"""The optional .npz array of expected classes (never a model input)."""


def _labels_from_npz(source: NpzData, samples: int) -> np.ndarray | None:
    with np.load(source.path, allow_pickle=False) as archive:
        if LABELS not in archive.files:
            return None
        labels = archive[LABELS]
    if not np.issubdtype(labels.dtype, np.integer) or labels.ndim not in (1, 2):
        raise SampleError(
            f"{source.path}: {LABELS!r} must be integer class ids of shape [samples] or "
            f"[samples, seq], got {labels.dtype} {labels.shape}"
        )
    if labels.shape[0] < samples:
        raise SampleError(f"{source.path}: {LABELS!r} has {labels.shape[0]} rows, need {samples}")
    return np.ascontiguousarray(labels[:samples])


def _from_npz(source: NpzData, samples: int, signature: IOSignature) -> dict[str, np.ndarray]:
    if not source.path.is_file():
        raise SampleError(f"sample file {source.path} does not exist")
    try:
        with np.load(source.path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError) as exc:
        raise SampleError(f"{source.path}: cannot read as .npz: {exc}") from None
    missing = [t.name for t in signature.inputs if t.name not in arrays]
    if missing:
        raise SampleError(
            f"{source.path}: no array for model input(s) {missing}; the file holds {sorted(arrays)}"
        )
    columns: dict[str, np.ndarray] = {}
    for tensor in signature.inputs:
        array = arrays[tensor.name]
        if array.ndim != len(tensor.shape):
            raise SampleError(
                f"{source.path}: {tensor.name!r} has rank {array.ndim}, the model expects "
                f"{len(tensor.shape)} ({tensor.shape}); samples go along axis 0"
            )
        if array.dtype != np.dtype(tensor.dtype):
            raise SampleError(
                f"{source.path}: {tensor.name!r} is {array.dtype}, the model expects {tensor.dtype}"
            )
        columns[tensor.name] = array
    available = min(int(a.shape[0]) for a in columns.values())
    if available < samples:
        raise SampleError(
            f"{source.path}: holds {available} samples, the spec asks for {samples}; "
            "lower 'samples' or add data"
        )
    return {k: v[:samples] for k, v in columns.items()}


def _generate(
    source: GeneratorData,
    samples: int,
    seed: int,
    signature: IOSignature,
    max_seq_len: int | None,
) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    seq_len = source.seq_len if max_seq_len is None else min(source.seq_len, max_seq_len)
    if source.generator is Generator.DEMO_TEXT:
        if not signature.is_decoder:
            raise SampleError(
                "generator 'demo-text' needs a decoder model with inputs "
                f"{list(DECODER_INPUTS)} and output 'logits'"
            )
        return _demo_text(rng, samples, seq_len)
    if source.generator is Generator.TEXT:
        if not signature.is_decoder or source.tokenizer is None:
            raise SampleError(
                "generator 'text' needs a decoder model (input_ids, attention_mask in, "
                "logits out) and the build's tokenizer"
            )
        return _tokenized_text(rng, samples, seq_len, source.tokenizer)
    if source.generator is Generator.PROMPTS:
        if not signature.is_decoder or source.tokenizer is None or source.prompts is None:
            raise SampleError(
                "prompts need a decoder model (input_ids, attention_mask in, logits out) "
                "and the build's tokenizer"
            )
        return _prompt_rows(source.prompts, samples, seq_len, source.tokenizer)
    highs, shapes = dict(source.int_highs), dict(source.shapes)
    # Positions and a decoder's (empty) past are derived, as the worker derives them
    # (builder.runtime.complete_feeds): no samples.
    derived = derived_inputs(signature)
    return {
        t.name: _random_tensor(
            rng, t, samples, seq_len, highs.get(t.name, source.int_high), shapes.get(t.name)
        )
        for t in signature.inputs
        if t.name not in derived
    }


_SENTENCES = (
    "Gray releases move traffic to a new model version a little at a time.",
    "The canary takes one percent of requests before it earns more.",
    "A worker groups requests into shape buckets and runs them as one batch.",
    "When latency rises above the objective, the controller steps down a precision rung.",
    "Every routing decision is recorded with the window statistics that caused it.",
    "Shadow traffic lets a candidate answer real questions without anyone seeing its replies.",
    "Kafka keeps the queue for each version apart so one backlog cannot stall another.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Quantized weights trade a little accuracy for a lot of throughput on small machines.",
    "Rolling back means setting the candidate weight to zero at once.",
    "Small models answer fast; large models answer well; the ladder picks between them.",
    "A manifest lists the digest of every file so tampering is caught before loading.",
    "Calibration runs representative inputs through the graph to measure activation ranges.",
    "Dynamic shapes need optimization profiles that cover the smallest and largest inputs.",
    "Sticky buckets keep a user on the version they first reached while weights grow.",
    "Tokens are bytes here, so any text can be encoded without a vocabulary file.",
)


def demo_sentences() -> tuple[str, ...]:
    """The English corpus behind the ``demo-text`` generator."""
    return _SENTENCES


def _demo_text(rng: np.random.Generator, samples: int, seq_len: int) -> dict[str, np.ndarray]:
    from graylane.models.byte_vocab import BOS_ID, PAD_ID, encode_text

    ids = np.full((samples, seq_len), PAD_ID, dtype=np.int64)
    mask = np.zeros((samples, seq_len), dtype=np.int64)
    for row in range(samples):
        # Lengths vary so right-padding is exercised; at least half the row is real text.
        length = int(rng.integers(max(2, seq_len // 2), seq_len + 1))
        tokens: list[int] = [BOS_ID]
        while len(tokens) < length:
            sentence = _SENTENCES[int(rng.integers(len(_SENTENCES)))]
            tokens.extend(encode_text(sentence + " "))
        ids[row, :length] = tokens[:length]
        mask[row, :length] = 1
    return {DECODER_INPUTS[0]: ids, DECODER_INPUTS[1]: mask}


def _tokenized_text(
    rng: np.random.Generator, samples: int, seq_len: int, tokenizer: Path
) -> dict[str, np.ndarray]:
    """Rows of the corpus encoded with ``tokenizer``, right-padded (id 0, mask 0)."""
    from graylane.models.hf_tokenizer import HfTokenizer

    encoder = HfTokenizer(tokenizer)
    encoded = [encoder.encode(s + " ") for s in _SENTENCES]
    ids = np.zeros((samples, seq_len), dtype=np.int64)
    mask = np.zeros((samples, seq_len), dtype=np.int64)
    for row in range(samples):
        length = int(rng.integers(max(2, seq_len // 2), seq_len + 1))
        tokens: list[int] = []
        while len(tokens) < length:
            tokens.extend(encoded[int(rng.integers(len(encoded)))])
        ids[row, :length] = tokens[:length]
        mask[row, :length] = 1
    return {DECODER_INPUTS[0]: ids, DECODER_INPUTS[1]: mask}


def _prompt_rows(
    prompts: Path, samples: int, seq_len: int, tokenizer: Path
) -> dict[str, np.ndarray]:
    """The first ``samples`` prompts of the file, one per row, encoded as the worker encodes
    a completion's prompt, cut to ``seq_len`` and right-padded (id 0, mask 0)."""
    from graylane.builder.spec import read_prompts
    from graylane.models.hf_tokenizer import HfTokenizer

    encoder = HfTokenizer(tokenizer)
    texts = read_prompts(prompts)
    if len(texts) < samples:
        raise SampleError(f"{prompts}: holds {len(texts)} prompts, the spec asks for {samples}")
    encoded = [encoder.encode(text)[:seq_len] for text in texts[:samples]]
    width = max(len(e) for e in encoded)
    ids = np.zeros((samples, width), dtype=np.int64)
    mask = np.zeros((samples, width), dtype=np.int64)
    for row, tokens in enumerate(encoded):
        ids[row, : len(tokens)] = tokens
        mask[row, : len(tokens)] = 1
    return {DECODER_INPUTS[0]: ids, DECODER_INPUTS[1]: mask}


def _random_tensor(
    rng: np.random.Generator,
    tensor: TensorSpec,
    samples: int,
    seq_len: int,
    int_high: int,
    dims: tuple[int, ...] | None = None,
) -> np.ndarray:
    # Axis 0 is the sample axis; other dynamic dims take seq_len unless ``dims`` are given.
    rest = (
        dims
        if dims is not None
        else (d if isinstance(d, int) else seq_len for d in tensor.shape[1:])
    )
    shape = (samples, *rest)
    dtype = np.dtype(tensor.dtype)
    if tensor.name == DECODER_INPUTS[1]:
        return np.ones(shape, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        return rng.integers(0, int_high, size=shape).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, size=shape).astype(np.bool_)
    return rng.standard_normal(shape).astype(dtype)
