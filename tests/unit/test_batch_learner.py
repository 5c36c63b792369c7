"""The adaptive batch learner as pure logic: what it converges to for given engine costs."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from graylane.engine_worker.batch_learner import (
    BatchChoice,
    BatchLearner,
    LearnerConfig,
    LearnerConfigError,
)

PADDED = 64


def run_cycle(
    learner: BatchLearner,
    choice: BatchChoice,
    queued: int,
    cost_ms: Callable[[int], float],
    noise: Callable[[], float],
) -> list[int]:
    """One cycle as the worker runs it: an exploring choice's first batch, then the rest."""
    sizes = []
    cap = choice.max_batch
    while queued:
        n = min(cap, queued)
        learner.observe(n, cost_ms(n) * noise(), PADDED)
        sizes.append(n)
        queued -= n
        cap = choice.steady_batch
    return sizes


def simulate(
    cost_ms: Callable[[int], float],
    *,
    max_batch: int = 8,
    rounds: int = 400,
    seed: int = 0,
    **kw: float,
) -> tuple[BatchLearner, BatchChoice]:
    """Saturated traffic: the queue always holds max_batch requests; the engine's
    time for a batch of n rows is cost_ms(n) with +-5 % noise."""
    rng = random.Random(seed)
    learner = BatchLearner(LearnerConfig(max_batch_size=max_batch, max_wait_ms=5, **kw))
    choice = learner.choose()
    for _ in range(rounds):
        run_cycle(learner, choice, max_batch, cost_ms, lambda: rng.uniform(0.95, 1.05))
        choice = learner.choose()
    # the steady choice, not an exploring one
    while choice.exploring:
        learner.observe(1, cost_ms(1), PADDED)
        choice = learner.choose()
    return learner, choice


def test_linear_cost_converges_to_batch_one_without_wait() -> None:
    learner, choice = simulate(lambda n: 4.0 * n)
    assert choice == BatchChoice(1, 0.0)
    assert learner.best_size() == 1


def test_linear_cost_with_noise_never_waits() -> None:
    for seed in range(5):
        _, choice = simulate(lambda n: 3.0 * n + 0.05, seed=seed)
        assert choice.max_batch == 1
        assert choice.wait_ms == 0.0


def test_sublinear_cost_converges_to_a_large_batch_with_a_bounded_wait() -> None:
    learner, choice = simulate(lambda n: 4.0 + 0.5 * n)
    assert choice.max_batch == 8
    assert 0 < choice.wait_ms <= 5
    # the wait never exceeds one row's unbatched time
    single = learner.batch_ms(1)
    assert single is None or choice.wait_ms <= single


def test_gain_that_saturates_picks_the_knee() -> None:
    # per-row cost falls until 4 rows, then every row costs the same again
    _, choice = simulate(lambda n: 8.0 + 2.0 * n if n <= 4 else 4.0 * n)
    assert choice.max_batch == 4


def test_latency_budget_caps_the_batch() -> None:
    # batch of n costs 4 + n ms; a budget of 8.5 ms admits at most 4 rows
    learner, choice = simulate(lambda n: 4.0 + 1.0 * n, latency_budget_ms=8.5)
    assert choice.max_batch == 4
    total = learner.batch_ms(4)
    assert total is not None and choice.wait_ms <= 8.5 - total + 1e-9


def test_starts_by_measuring_each_candidate_without_waiting() -> None:
    learner = BatchLearner(LearnerConfig(max_batch_size=6, max_wait_ms=5, min_samples=2))
    assert learner.candidates() == (1, 2, 4, 6)
    seen = []
    for _ in range(8):
        choice = learner.choose()
        assert choice.exploring and choice.wait_ms == 0.0
        seen.append(choice.max_batch)
        learner.observe(choice.max_batch, 2.0 * choice.max_batch, PADDED)
    assert seen == [1, 1, 2, 2, 4, 4, 6, 6]
    assert not learner.choose().exploring


def test_explores_periodically_once_converged() -> None:
    learner = BatchLearner(
        LearnerConfig(max_batch_size=2, max_wait_ms=5, explore_every=10, min_samples=1)
    )
    learner.observe(2, 8.0, PADDED)
    choices = []
    for _ in range(39):
        learner.observe(1, 4.0, PADDED)
        choices.append(learner.choose())
    exploring = [c for c in choices if c.exploring]
    # one batch of the other size every 10 batches, then back to the size in use
    assert [(c.max_batch, c.then) for c in exploring] == [(2, 1)] * 3
    assert all(c == BatchChoice(1, 0.0) for c in choices if not c.exploring)


def _drifting(seed: int) -> tuple[Callable[[int], float], Callable[[], float], Callable[[], None]]:
    """A shared machine: every size slows down alike by a load factor that jumps
    between 1x and 3x every 40 cycles, plus +-25 % noise per batch."""
    rng = random.Random(seed)
    cycle = [0]

    def noise() -> float:
        load = 3.0 if (cycle[0] // 40) % 2 else 1.0
        return load * rng.uniform(0.75, 1.25)

    def tick() -> None:
        cycle[0] += 1

    return (lambda n: 0.0), noise, tick


@pytest.mark.parametrize("seed", range(4))
def test_load_drift_does_not_make_a_stale_size_look_cheap(seed: int) -> None:
    # engine: a batch of 8 serves 1.45x the rows per second of batch 1 (the demo GPT
    # on 2 cores); under a load that changes every few seconds the learner must keep 8
    _, noise, tick = _drifting(seed)

    def cost(n: int) -> float:
        return 19.0 * n / (1 + 0.45 * (n - 1) / 7)

    learner = BatchLearner(LearnerConfig(max_batch_size=8, max_wait_ms=5))
    choice = learner.choose()
    steady: list[int] = []
    rows, spent = 0, 0.0
    for cycle in range(600):
        sizes = run_cycle(learner, choice, 32, cost, noise)
        tick()
        choice = learner.choose()
        if cycle >= 150:
            steady.append(choice.steady_batch)
            rows += sum(sizes)
            spent += sum(cost(n) for n in sizes)
    assert steady.count(8) / len(steady) >= 0.97
    # exploration (one small batch every few) costs at most 3 % of throughput (the
    # learner compared by moving averages of absolute costs lost 6 % here)
    assert rows / spent >= 0.97 * 8 / cost(8)


@pytest.mark.parametrize("seed", range(4))
def test_load_drift_keeps_a_linear_engine_at_batch_one(seed: int) -> None:
    _, noise, tick = _drifting(seed)
    learner = BatchLearner(LearnerConfig(max_batch_size=8, max_wait_ms=5))
    choice = learner.choose()
    for cycle in range(600):
        run_cycle(learner, choice, 32, lambda n: 4.0 * n, noise)
        tick()
        choice = learner.choose()
        if cycle >= 400:  # batch 1, never a wait (an exploring batch waits for nothing)
            assert choice.steady_batch == 1 and choice.wait_ms == 0.0


def test_cost_is_normalised_by_padded_length() -> None:
    learner = BatchLearner(LearnerConfig(max_batch_size=4, max_wait_ms=5, min_samples=1))
    learner.observe(2, 10.0, 128)
    assert learner.batch_ms(2) == pytest.approx(5.0)  # at the reference length 64


def test_ignores_malformed_samples() -> None:
    learner = BatchLearner(LearnerConfig(max_batch_size=4, max_wait_ms=5, min_samples=1))
    learner.observe(0, 10.0, 64)
    learner.observe(2, -1.0, 64)
    assert learner.batch_ms(2) is None


@pytest.mark.parametrize(
    "kw",
    [
        {"max_batch_size": 0, "max_wait_ms": 5},
        {"max_batch_size": 4, "max_wait_ms": -1},
        {"max_batch_size": 4, "max_wait_ms": 5, "window": 0},
        {"max_batch_size": 4, "max_wait_ms": 5, "explore_every": 0},
    ],
)
def test_rejects_malformed_config(kw: dict[str, float]) -> None:
    with pytest.raises(LearnerConfigError):
        LearnerConfig(**kw)  # type: ignore[arg-type]
