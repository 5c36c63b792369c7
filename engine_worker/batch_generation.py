"""Generation for one planned batch, run to its end: per-batch (not continuous) decoding.

Without a KV cache every step reruns each active sequence (:func:`run_generate`): all
active rows run together (right-padded, logits read at each row's last real position)
and a row that finishes is dropped from the next step. A model exported with a KV cache
runs one prefill and one incremental step per token instead
(:func:`~graylane.engine_worker.kv_decode.generate_with_cache`), with the same results.
A worker whose model has a KV cache and runs continuous batching does not come here: its
generations join the running decode batch
(:class:`~graylane.engine_worker.generation.ContinuousDecoder`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from graylane.engine.errors import InvalidInputError
from graylane.engine.protocol import InferenceEngine
from graylane.engine_worker.forward import check_ids, forward_token_rows, full_row, primary_output
from graylane.engine_worker.kv_decode import (
    Decode,
    FinishReason,
    GenerationResult,
    generate_with_cache,
    per_prompt,
    sampler_for,
)
from graylane.engine_worker.layouts import kv_cache_layout, token_layout
from graylane.engine_worker.logic.batching import BucketPolicy, InvalidPolicyError
from graylane.engine_worker.logic.sampling import SamplingParams

__all__ = ["run_generate"]


def run_generate(
    engine: InferenceEngine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int] | int,
    eos_id: int | Sequence[int | None] | None,
    max_seq_len: int,
    *,
    output_name: str | None = None,
    policy: BucketPolicy | None = None,
    pad_id: int = 0,
    sampling: SamplingParams | Sequence[SamplingParams | None] | None = None,
    decode: Decode | None = None,
) -> list[GenerationResult]:
    """Decoding without a KV cache: every step reruns each active sequence.

    All active rows run together (right-padded, logits read at each row's last
    real position); a row that finishes is dropped from the next step. A model
    exported with a KV cache (``past_key_values.*``) runs one prefill and one
    incremental step per token instead (:func:`generate_with_cache`).

    ``eos_id`` and ``sampling`` are one for all prompts or one per prompt
    (``None``: no EOS; greedy). Stop strings need ``decode``.
    """
    if kv_cache_layout(engine.io) is not None:
        return generate_with_cache(
            engine,
            prompts,
            max_new_tokens,
            eos_id,
            max_seq_len,
            policy=policy,
            pad_id=pad_id,
            sampling=sampling,
            decode=decode,
        )
    layout = token_layout(engine.io)
    if layout is None:
        raise InvalidInputError(
            f"generation needs a token model, inputs are {engine.io.input_names}"
        )
    logits_name = primary_output(engine.io, output_name)
    limits = (
        [max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int) else list(max_new_tokens)
    )
    if len(limits) != len(prompts):
        raise InvalidInputError(f"{len(limits)} max_new_tokens for {len(prompts)} prompts")
    eos_ids = per_prompt(eos_id, len(prompts), "eos ids")
    samplers = [
        sampler_for(params, decode, f"prompt {i}")
        for i, params in enumerate(per_prompt(sampling, len(prompts), "sampling params"))
    ]
    if max_seq_len < 1:
        raise InvalidInputError(f"max_seq_len must be >= 1, got {max_seq_len}")
    if policy is not None and policy.max_seq_len < max_seq_len:
        raise InvalidPolicyError(
            f"largest bucket {policy.max_seq_len} is below max_seq_len {max_seq_len}"
        )
    seqs: list[list[int]] = []
    for i, (prompt, limit) in enumerate(zip(prompts, limits, strict=True)):
        tokens = [int(t) for t in prompt]
        if not tokens:
            raise InvalidInputError(f"prompt {i} is empty")
        if len(tokens) > max_seq_len:
            raise InvalidInputError(f"prompt {i} has {len(tokens)} tokens, max is {max_seq_len}")
        if limit < 0:
            raise InvalidInputError(f"max_new_tokens for prompt {i} is negative")
        check_ids(layout, np.asarray(tokens), f"prompt {i}")
        seqs.append(tokens)

    generated: list[list[int]] = [[] for _ in prompts]
    done: dict[int, FinishReason] = {}
    texts: dict[int, str] = {}
    for i, tokens in enumerate(seqs):
        if limits[i] == 0:
            done[i] = FinishReason.LENGTH
        elif len(tokens) >= max_seq_len:
            done[i] = FinishReason.MAX_SEQ
    active = [i for i in range(len(seqs)) if i not in done]
    while active:
        rows = [full_row(layout, seqs[i]) for i in active]
        outputs = forward_token_rows(engine, layout, rows, policy, pad_id)
        still: list[int] = []
        for i, out in zip(active, outputs, strict=True):
            token = samplers[i].choose(out[logits_name][0, len(seqs[i]) - 1])
            if eos_ids[i] is not None and token == eos_ids[i]:
                done[i] = FinishReason.EOS
                continue
            if samplers[i].stops_on(token):
                done[i] = FinishReason.STOP
                continue
            seqs[i].append(token)
            generated[i].append(token)
            cut = samplers[i].cut(generated[i])
            if cut is not None:
                done[i], texts[i] = FinishReason.STOP, cut.text
                del generated[i][cut.tokens :]
            elif len(generated[i]) >= limits[i]:
                done[i] = FinishReason.LENGTH
            elif len(seqs[i]) >= max_seq_len:
                done[i] = FinishReason.MAX_SEQ
            else:
                still.append(i)
        active = still
    return [GenerationResult(tuple(generated[i]), done[i], texts.get(i)) for i in range(len(seqs))]
