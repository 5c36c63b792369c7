"""The adaptive batch learner as pure logic: what it converges to for given engine costs."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from graylane.engine_worker.logic.batch_learner import (
    BatchChoice,
    BatchLearner,
    CycleCost,
    LearnerConfig,
    LearnerConfigError,
    fit_cycle_cost,
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


# -- batches sized by the queue ------------------------------------------------------------


def test_cycle_cost_fit_recovers_per_batch_and_per_row_costs() -> None:
    rng = random.Random(3)
    cycles = []
    for _ in range(40):
        batches = rng.randint(1, 16)
        rows = batches * rng.randint(1, 8)
        cycles.append((batches, rows, (0.8 * batches + 0.05 * rows) * rng.uniform(0.95, 1.05)))
    cost = fit_cycle_cost(cycles)
    assert cost.per_batch_ms == pytest.approx(0.8, rel=0.1)
    assert cost.per_row_ms == pytest.approx(0.05, rel=0.2)


def test_cycle_cost_fit_claims_no_batch_saving_when_it_cannot_tell() -> None:
    # every cycle ran batches of 4: per batch and per row are the same thing here
    cost = fit_cycle_cost([(b, 4 * b, 2.0 * b) for b in (1, 2, 3, 5, 8)])
    assert cost.per_batch_ms == 0.0
    assert cost.per_row_ms == pytest.approx(0.5)
    assert fit_cycle_cost([(2, 0, 1.0)]) == CycleCost(0.0, 0.0)


def queued_run(
    engine_ms: Callable[[int], float],
    *,
    per_batch_ms: float,
    queue: Callable[[int], int],
    cycles: int = 400,
    seed: int = 0,
    **kw: float,
) -> tuple[BatchLearner, list[BatchChoice]]:
    """Cycles as the worker runs them: the fetch brings ``queue(cycle)`` rows, the learner
    chooses knowing them, each batch costs ``engine_ms(n)`` (+-10 % noise) and the cycle
    ``per_batch_ms`` per batch outside the batches (fetch, decode, commit shares)."""
    rng = random.Random(seed)
    learner = BatchLearner(LearnerConfig(max_batch_size=32, max_wait_ms=5, **kw))
    choices = []
    for cycle in range(cycles):
        rows = queue(cycle)
        choice = learner.choose(backlog=rows)
        choices.append(choice)
        sizes = run_cycle(learner, choice, rows, engine_ms, lambda: rng.uniform(0.9, 1.1))
        outside = (per_batch_ms * len(sizes) + 0.02 * rows) * rng.uniform(0.9, 1.1)
        learner.observe_cycle(len(sizes), rows, outside)
    return learner, choices


def steady_choice(learner: BatchLearner, backlog: int) -> BatchChoice:
    """The next choice that is not a periodic exploration."""
    choice = learner.choose(backlog=backlog)
    while choice.exploring:
        choice = learner.choose(backlog=backlog)
    return choice


def flat(n: int) -> float:
    """An engine that gains nothing from batching (the tiny demo GPT on one CPU thread)."""
    return 0.7 * n


def test_a_deep_queue_takes_full_batches_where_the_engine_gains_nothing() -> None:
    for seed in range(4):
        learner, choices = queued_run(flat, per_batch_ms=1.0, queue=lambda _: 128, seed=seed)
        steady = [c for c in choices[200:] if not c.exploring]
        assert steady and all(c == BatchChoice(32, 0.0) for c in steady)
        # the cycle's per-batch cost was counted, and it is what pays for the batch
        cost = learner.cycle_cost()
        assert cost is not None and cost.per_batch_ms == pytest.approx(1.0, rel=0.25)
        # without a queue the same learner still answers one request at once
        assert steady_choice(learner, backlog=1) == BatchChoice(1, 0.0)


def test_an_empty_queue_keeps_batch_one_latency() -> None:
    _, choices = queued_run(flat, per_batch_ms=1.0, queue=lambda _: 1)
    assert all(c.max_batch == 1 and c.wait_ms == 0.0 for c in choices[100:] if not c.exploring)


def test_the_queue_switches_the_size_back_and_forth() -> None:
    # 50 cycles of a deep queue, then 50 of single requests, in turn
    _, choices = queued_run(
        flat, per_batch_ms=1.0, queue=lambda c: 128 if (c // 50) % 2 else 1, cycles=600
    )
    for cycle in range(300, 600):
        c = choices[cycle]
        if c.exploring:
            continue
        if (cycle // 50) % 2:
            assert c == BatchChoice(32, 0.0), cycle
        else:
            assert c == BatchChoice(1, 0.0), cycle


def test_a_queue_does_not_buy_batches_the_engine_makes_dearer() -> None:
    # rows cost 4x as much beyond 8 per batch (a cache falls over): the queue's per-batch
    # saving is far smaller than that, so the batch stays at 8
    def knee(n: int) -> float:
        return 0.7 * n if n <= 8 else 0.7 * 8 + 2.8 * (n - 8)

    _, choices = queued_run(knee, per_batch_ms=1.0, queue=lambda _: 128)
    # (a cycle of 16 batches explores one batch of another size every cycle, then goes on
    # with the size in use)
    assert all(c.steady_batch == 8 for c in choices[200:])


def test_a_queue_stays_within_the_latency_budget() -> None:
    # a batch of n takes 0.7 n ms; a budget of 12 ms admits 16 rows, not 32
    _, choices = queued_run(flat, per_batch_ms=1.0, queue=lambda _: 128, latency_budget_ms=12.0)
    assert all(c.steady_batch == 16 and c.wait_ms == 0.0 for c in choices[200:])


def test_a_backlog_smaller_than_a_batch_is_not_waited_for() -> None:
    learner, _ = queued_run(flat, per_batch_ms=1.0, queue=lambda _: 128)
    assert steady_choice(learner, backlog=10) == BatchChoice(8, 0.0)
