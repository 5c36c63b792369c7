"""Validate a variant against the fp32 reference on held-out samples.

Metrics, over every floating-point output and every real position (rows of the
last axis where ``attention_mask`` is 1, or all rows for models without one):

- ``max_abs``: largest absolute difference of any element;
- ``mean_rel``: relative L1 error, ``sum |cand - ref| / sum |ref|`` (stable where
  single elements are near zero, unlike a mean of element ratios);
- ``cosine``: mean over rows of the cosine similarity of candidate and reference;
- ``top1_agreement``: fraction of rows whose argmax is the same;
- for decoder models (``input_ids``/``attention_mask`` in, ``logits`` out), greedy
  generation from ``prompts`` prompts for ``new_tokens`` tokens each:
  ``token_agreement`` is the mean, over prompts, of the fraction of generated
  tokens before the first divergence (after it the two runs condition on different
  text, so later matches say little); ``token_agreement_overall`` is the plain
  position-wise fraction of identical tokens.

Where a model has several float outputs the worst value of each metric is kept; a
decoder's KV-cache outputs (``present.*``) are not compared.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from graylane.artifacts.build_info import ComparisonReport, Metrics, Tolerance
from graylane.artifacts.naming import Precision
from graylane.builder.samples import SampleSet
from graylane.builder.spec import GenerationCheck
from graylane.engine.signature import DECODER_INPUTS, DECODER_OUTPUT, IOSignature

__all__ = [
    "ReferenceOutputs",
    "Runner",
    "ValidationResult",
    "check_tolerance",
    "compare_outputs",
    "generation_prompts",
    "greedy_continue",
    "greedy_generate",
    "label_accuracy",
    "reference_outputs",
    "token_agreement",
    "validate_variant",
]

_EPS = 1e-12
_CACHE_OUTPUT = "present."
"""A decoder's KV-cache outputs (``present.N.key|value``) are state, not answers: the
argmax of a key vector over its head dimensions means nothing, and it used to be the
"worst" top-1 agreement of a decoder variant (SmolLM2 int8-weight-only: 0.87 from the
cache, 0.97 from the logits)."""

Runner = Callable[[Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


@dataclass(frozen=True)
class ValidationResult:
    """The verdict on one variant; ``failures`` lists each limit it missed."""

    precision: Precision
    tolerance: Tolerance
    metrics: Metrics | None
    failures: tuple[str, ...] = ()
    error: str | None = None
    comparison: ComparisonReport | None = None

    @property
    def passed(self) -> bool:
        return self.metrics is not None and self.error is None and not self.failures


def _rows(output: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Last-axis vectors at real positions, as float64 ``[rows, width]``."""
    array = np.asarray(output, dtype=np.float64)
    if array.ndim == 0:
        return array.reshape(1, 1)
    if mask is not None and array.ndim >= 3 and array.shape[:2] == mask.shape:
        selected: np.ndarray = array[mask.astype(bool)]
        return selected.reshape(-1, array.shape[-1])
    return array.reshape(-1, array.shape[-1])


def compare_outputs(
    reference: Sequence[Mapping[str, np.ndarray]],
    candidate: Sequence[Mapping[str, np.ndarray]],
    masks: Sequence[np.ndarray | None],
) -> Metrics:
    """Metrics over batches of outputs (same order in all three sequences)."""
    if not len(reference) == len(candidate) == len(masks):
        raise ValueError("reference, candidate and masks must have one entry per batch")
    if not reference:
        raise ValueError("no batches to compare")
    names = [
        n
        for n, v in reference[0].items()
        if np.issubdtype(np.asarray(v).dtype, np.floating) and not n.startswith(_CACHE_OUTPUT)
    ]
    if not names:
        raise ValueError("the model has no floating-point output to compare")
    per_output: list[Metrics] = []
    for name in names:
        ref = np.concatenate([_rows(r[name], m) for r, m in zip(reference, masks, strict=True)])
        cand = np.concatenate([_rows(c[name], m) for c, m in zip(candidate, masks, strict=True)])
        if ref.shape != cand.shape:
            raise ValueError(f"output {name!r}: shapes differ, {ref.shape} vs {cand.shape}")
        diff = np.abs(cand - ref)
        norms = np.linalg.norm(ref, axis=-1) * np.linalg.norm(cand, axis=-1)
        dots = np.sum(ref * cand, axis=-1)
        cos = np.where(norms > _EPS, dots / np.maximum(norms, _EPS), 1.0)
        metrics = Metrics(
            max_abs=float(diff.max(initial=0.0)),
            mean_rel=float(diff.sum() / max(float(np.abs(ref).sum()), _EPS)),
            cosine=float(cos.mean()),
            top1_agreement=float(np.mean(ref.argmax(axis=-1) == cand.argmax(axis=-1))),
            rows=int(ref.shape[0]),
        )
        per_output.append(metrics)
    return functools.reduce(_worse, per_output)


def _worse(a: Metrics, b: Metrics) -> Metrics:
    return Metrics(
        max_abs=max(a.max_abs, b.max_abs),
        mean_rel=max(a.mean_rel, b.mean_rel),
        cosine=min(a.cosine, b.cosine),
        top1_agreement=min(a.top1_agreement, b.top1_agreement),
        rows=max(a.rows, b.rows),
    )


def token_agreement(reference: np.ndarray, candidate: np.ndarray) -> tuple[float, float]:
    """(prefix agreement, position-wise agreement) of two ``[prompts, tokens]`` arrays."""
    if reference.shape != candidate.shape:
        raise ValueError(f"token arrays differ in shape: {reference.shape} vs {candidate.shape}")
    if reference.size == 0:
        return 1.0, 1.0
    same = reference == candidate
    width = reference.shape[1]
    # Index of the first mismatch per row, or the row width when none.
    first = np.where(same.all(axis=1), width, np.argmin(same, axis=1))
    return float(np.mean(first / width)), float(same.mean())


def label_accuracy(
    outputs: Sequence[Mapping[str, np.ndarray]],
    labels: Sequence[np.ndarray],
    masks: Sequence[np.ndarray | None],
) -> float:
    """Share of labelled rows whose argmax is the label.

    The output judged is the first floating-point one whose leading shape is the
    labels' (``[batch, classes]`` for ``[batch]`` labels, ``[batch, seq, classes]`` for
    ``[batch, seq]``); negative labels (e.g. -100, padding) and masked positions are
    not counted.
    """
    right = total = 0
    for out, lab, mask in zip(outputs, labels, masks, strict=True):
        candidates = [
            np.asarray(v)
            for v in out.values()
            if np.issubdtype(np.asarray(v).dtype, np.floating)
            and np.asarray(v).ndim == lab.ndim + 1
            and np.asarray(v).shape[: lab.ndim] == lab.shape
        ]
        if not candidates:
            raise ValueError(f"no float output has the labels' leading shape {lab.shape}")
        predicted = candidates[0].argmax(axis=-1)
        keep = lab >= 0
        if mask is not None and mask.shape == lab.shape:
            keep &= mask.astype(bool)
        right += int(np.sum((predicted == lab) & keep))
        total += int(np.sum(keep))
    if total == 0:
        raise ValueError("the labels mark no row to score")
    return right / total


def check_tolerance(metrics: Metrics, tolerance: Tolerance) -> tuple[str, ...]:
    """Human-readable list of the limits ``metrics`` misses.

    With labels (``metrics.accuracy``) and ``max_accuracy_drop`` set, the accuracy lost
    against fp32 is the task-level limit and replaces ``min_top1_agreement``.
    """
    failures: list[str] = []
    if tolerance.max_abs is not None and metrics.max_abs > tolerance.max_abs:
        failures.append(f"max_abs {metrics.max_abs:.4g} > {tolerance.max_abs:.4g}")
    if tolerance.min_cosine is not None and metrics.cosine < tolerance.min_cosine:
        failures.append(f"cosine {metrics.cosine:.6f} < {tolerance.min_cosine}")
    by_labels = (
        tolerance.max_accuracy_drop is not None
        and metrics.accuracy is not None
        and metrics.reference_accuracy is not None
    )
    if by_labels:
        assert metrics.accuracy is not None and metrics.reference_accuracy is not None
        assert tolerance.max_accuracy_drop is not None
        drop = metrics.reference_accuracy - metrics.accuracy
        if drop > tolerance.max_accuracy_drop:
            failures.append(
                f"accuracy {metrics.accuracy:.4f} is {drop * 100:.2f} pp below fp32's "
                f"{metrics.reference_accuracy:.4f} (limit {tolerance.max_accuracy_drop * 100:g} pp)"
            )
    if (
        not by_labels
        and tolerance.min_top1_agreement is not None
        and metrics.top1_agreement < tolerance.min_top1_agreement
    ):
        failures.append(
            f"top1_agreement {metrics.top1_agreement:.4f} < {tolerance.min_top1_agreement}"
        )
    if (
        tolerance.min_token_agreement is not None
        and metrics.token_agreement is not None
        and metrics.token_agreement < tolerance.min_token_agreement
    ):
        failures.append(
            f"token_agreement {metrics.token_agreement:.4f} < {tolerance.min_token_agreement}"
        )
    return tuple(failures)


def generation_prompts(
    samples: SampleSet, count: int, new_tokens: int, max_seq_len: int | None
) -> list[np.ndarray]:
    """The real tokens of the first ``count`` samples, cut to leave room for ``new_tokens``."""
    limit = None if max_seq_len is None else max(1, max_seq_len - new_tokens)
    prompts: list[np.ndarray] = []
    scored = (
        [m[i] for m in samples.score_masks for i in range(len(m))]
        if samples.score_masks is not None
        else None
    )
    for index, row in enumerate(samples.rows()):
        ids = row[DECODER_INPUTS[0]][0]
        mask = row[DECODER_INPUTS[1]][0].astype(bool)
        tokens = ids[mask][:limit] if limit is not None else ids[mask]
        if scored is not None and scored[index].any():
            # A continued prompt: the prompt alone (up to its first judged position).
            tokens = tokens[: int(np.argmax(scored[index])) + 1]
        if len(tokens):
            prompts.append(tokens.astype(np.int64))
        if len(prompts) == count:
            break
    return prompts


@dataclass(frozen=True)
class ReferenceOutputs:
    """fp32 outputs computed once and reused for every variant."""

    outputs: tuple[Mapping[str, np.ndarray], ...]
    masks: tuple[np.ndarray | None, ...]
    tokens: np.ndarray | None
    prompts: tuple[np.ndarray, ...]


def reference_outputs(
    reference: Runner,
    samples: SampleSet,
    signature: IOSignature,
    generation: GenerationCheck | None,
    max_seq_len: int | None,
    pad_id: int = 0,
    outputs: Sequence[Mapping[str, np.ndarray]] | None = None,
) -> ReferenceOutputs:
    """``outputs``: the reference run's outputs when already computed (a Polygraphy run)."""
    outputs = tuple(outputs) if outputs is not None else tuple(reference(b) for b in samples)
    mask_name = DECODER_INPUTS[1]
    masks: tuple[np.ndarray | None, ...] = (
        samples.score_masks
        if samples.score_masks is not None
        else tuple(batch.get(mask_name) if mask_name in batch else None for batch in samples)
    )
    tokens = None
    prompts: tuple[np.ndarray, ...] = ()
    if signature.is_decoder and generation is not None:
        prompts = tuple(
            generation_prompts(samples, generation.prompts, generation.new_tokens, max_seq_len)
        )
        tokens = greedy_generate(reference, prompts, generation.new_tokens, pad_id)
    return ReferenceOutputs(outputs=outputs, masks=masks, tokens=tokens, prompts=prompts)


def validate_variant(
    precision: Precision,
    candidate: Runner,
    reference: ReferenceOutputs,
    samples: SampleSet,
    tolerance: Tolerance,
    pad_id: int = 0,
    outputs: Sequence[Mapping[str, np.ndarray]] | None = None,
    comparison: ComparisonReport | None = None,
) -> ValidationResult:
    """Judge ``candidate`` against the reference outputs.

    ``outputs``/``comparison``: the candidate's outputs and Polygraphy's report when the
    caller ran it through Polygraphy; otherwise ``candidate`` runs the samples here.
    """
    try:
        if outputs is None:
            outputs = [candidate(batch) for batch in samples]
        metrics = compare_outputs(reference.outputs, outputs, reference.masks)
        if reference.tokens is not None:
            tokens = greedy_generate(
                candidate, reference.prompts, reference.tokens.shape[1], pad_id
            )
            prefix, overall = token_agreement(reference.tokens, tokens)
            metrics = Metrics(
                max_abs=metrics.max_abs,
                mean_rel=metrics.mean_rel,
                cosine=metrics.cosine,
                top1_agreement=metrics.top1_agreement,
                rows=metrics.rows,
                token_agreement=prefix,
                token_agreement_overall=overall,
            )
        if samples.labels is not None:
            metrics = replace(
                metrics,
                accuracy=label_accuracy(outputs, samples.labels, reference.masks),
                reference_accuracy=label_accuracy(
                    reference.outputs, samples.labels, reference.masks
                ),
            )
    except Exception as exc:  # a variant that cannot run is a failed validation, not a crash
        return ValidationResult(
            precision=precision,
            tolerance=tolerance,
            metrics=None,
            error=str(exc),
            comparison=comparison,
        )
    return ValidationResult(
        precision=precision,
        tolerance=tolerance,
        metrics=metrics,
        failures=check_tolerance(metrics, tolerance),
        comparison=comparison,
    )


# -- greedy generation over any ``feeds -> outputs`` runner (full recompute, no KV cache)


def greedy_generate(
    run: Runner,
    prompts: Sequence[np.ndarray],
    new_tokens: int,
    pad_id: int = 0,
) -> np.ndarray:
    """Append ``new_tokens`` argmax tokens to every prompt; returns them as ``[n, new_tokens]``.

    Prompts are batched with right padding (attention_mask 0), which a causal model
    ignores at the real positions, so each row gets the tokens it would get alone.
    Generation never stops early: agreement is compared over a fixed length.
    """
    if not prompts:
        return np.zeros((0, new_tokens), dtype=np.int64)
    lengths = np.array([len(p) for p in prompts], dtype=np.int64)
    if lengths.min() < 1:
        raise ValueError("every prompt needs at least one token")
    width = int(lengths.max()) + new_tokens
    ids = np.full((len(prompts), width), pad_id, dtype=np.int64)
    mask = np.zeros((len(prompts), width), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids[row, : len(prompt)] = prompt
        mask[row, : len(prompt)] = 1
    generated = np.zeros((len(prompts), new_tokens), dtype=np.int64)
    rows = np.arange(len(prompts))
    for step in range(new_tokens):
        current = int(lengths.max())
        outputs = run({DECODER_INPUTS[0]: ids[:, :current], DECODER_INPUTS[1]: mask[:, :current]})
        logits = np.asarray(outputs[DECODER_OUTPUT])
        next_tokens = logits[rows, lengths - 1].argmax(axis=-1).astype(np.int64)
        ids[rows, lengths] = next_tokens
        mask[rows, lengths] = 1
        generated[:, step] = next_tokens
        lengths += 1
    return generated


def greedy_continue(
    run: Runner, io: IOSignature, prompts: Sequence[np.ndarray], new_tokens: int
) -> np.ndarray:
    """What :func:`greedy_generate` gives, one prompt at a time through the KV cache of a
    decoder with ``past_key_values.*`` inputs and ``present.*`` outputs (each step one
    token instead of the whole sequence); other models go through :func:`greedy_generate`."""
    from graylane.engine.derived_inputs import PAST_PREFIX, POSITION_IDS, USE_CACHE_BRANCH

    past = [s.name for s in io.inputs if s.name.startswith(PAST_PREFIX)]
    outputs = {s.name for s in io.outputs}
    present = {name: "present." + name[len(PAST_PREFIX) :] for name in past}
    if not past or not set(present.values()) <= outputs:
        return greedy_generate(run, prompts, new_tokens)
    generated = np.zeros((len(prompts), new_tokens), dtype=np.int64)
    for row, prompt in enumerate(prompts):
        ids = np.asarray([list(prompt)], dtype=np.int64)
        out = run({DECODER_INPUTS[0]: ids, DECODER_INPUTS[1]: np.ones_like(ids)})
        length = ids.shape[1]
        for step in range(new_tokens):
            token = int(np.asarray(out[DECODER_OUTPUT])[0, -1].argmax())
            generated[row, step] = token
            if step + 1 == new_tokens:
                break
            feeds = {name: np.asarray(out[present[name]]) for name in past}
            feeds[DECODER_INPUTS[0]] = np.asarray([[token]], dtype=np.int64)
            feeds[DECODER_INPUTS[1]] = np.ones((1, length + 1), dtype=np.int64)
            if io.find_input(POSITION_IDS) is not None:
                feeds[POSITION_IDS] = np.asarray([[length]], dtype=np.int64)
            if io.find_input(USE_CACHE_BRANCH) is not None:
                feeds[USE_CACHE_BRANCH] = np.array([True])
            out = run(feeds)
            length += 1
    return generated
