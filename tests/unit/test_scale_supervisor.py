"""The local supervisor (issue 12, item 3) without processes: requests in, starts and stops out."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from graylane import serde
from graylane.app.cli.demo import Service
from graylane.app.cli.main import build_parser
from graylane.app.cli.scaler import (
    ScaleSupervisor,
    WorkerTemplate,
    parse_workers,
    target_replicas,
)
from graylane.kafka.seam import KafkaFactory, Record
from graylane.v1 import control_pb2


class FakeProcess:
    def __init__(self) -> None:
        self.returncode: int | None = None
        self.signals: list[int] = []
        self.ignore_term = False

    def poll(self) -> int | None:
        return self.returncode

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig != signal.SIGUSR1 and not self.ignore_term:  # SIGUSR1 activates a standby
            self.returncode = -sig

    def kill(self) -> None:
        self.returncode = -9

    def wait(self, timeout: float | None = None) -> int:
        return self.returncode or 0


class Launches:
    def __init__(self) -> None:
        self.started: list[tuple[WorkerTemplate, int, FakeProcess]] = []

    def __call__(self, template: WorkerTemplate, index: int) -> Service:
        process = FakeProcess()
        self.started.append((template, index, process))
        return Service(f"w{index}", process, Path("/dev/null"))  # type: ignore[arg-type]


T = WorkerTemplate(model="gpt", version="v1", args=("--threads", "1"))


def request(desired: int, epoch: int, version: str = "v1") -> Record:
    pb = control_pb2.ScaleRequest(
        model="gpt", version=version, desired_replicas=desired, epoch=epoch, detail="test"
    )
    return Record(
        topic="p.control.scale",
        partition=0,
        offset=epoch,
        key=f"gpt/{version}".encode(),
        value=serde.encode(pb),
        timestamp=0,
        timestamp_type=0,
        checksum=None,
        serialized_key_size=0,
        serialized_value_size=0,
        headers=(),
    )


def supervisor(factory: KafkaFactory, **kw: object) -> tuple[ScaleSupervisor, Launches]:
    launches = Launches()
    options: dict[str, object] = {"max_workers": 3, "launcher": launches, "grace_s": 10.0}
    options.update(kw)
    return ScaleSupervisor(factory, [T], **options), launches  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("desired", "partitions", "expected"),
    [(None, 3, 1), (2, 3, 2), (5, 3, 3), (5, 2, 2), (0, 0, 1), (4, 0, 3)],
)
def test_target_is_the_request_within_min_max_and_partitions(
    desired: int | None, partitions: int, expected: int
) -> None:
    assert target_replicas(desired, min_workers=1, max_workers=3, partitions=partitions) == expected


def test_a_request_starts_a_second_worker_and_a_scale_in_stops_the_newest(
    factory: KafkaFactory,
) -> None:
    sup, launches = supervisor(factory)
    sup.partitions[T.key] = 3
    sup.reconcile(0.0)
    assert [i for _, i, _ in launches.started] == [1]  # min_workers before any request
    sup.on_record(request(2, 1))
    sup.reconcile(1.0)
    assert len(sup.running("gpt", "v1")) == 2 and launches.started[1][0] == T
    assert T.argv() == ["worker", "--model", "gpt", "--version", "v1", "--threads", "1"]
    sup.on_record(request(1, 2))
    sup.reconcile(2.0)
    newest = launches.started[1][2]
    assert newest.signals == [signal.SIGTERM] and newest.poll() is not None
    assert launches.started[0][2].signals == []  # the first worker keeps serving
    assert len(sup.running("gpt", "v1")) == 1


def test_stale_epochs_other_versions_and_the_partition_bound(factory: KafkaFactory) -> None:
    sup, launches = supervisor(factory)
    sup.partitions[T.key] = 2
    sup.on_record(request(3, 5))
    sup.on_record(request(1, 4))  # older: ignored
    sup.on_record(request(3, 9, version="v2"))  # not supervised here: ignored
    sup.reconcile(0.0)
    assert sup.desired == {("gpt", "v1"): 3}
    assert len(sup.running("gpt", "v1")) == 2  # 2 partitions: a third would sit idle
    assert len(launches.started) == 2


def test_a_dead_worker_is_restarted_after_the_backoff(factory: KafkaFactory) -> None:
    sup, launches = supervisor(factory, restart_backoff_s=5.0)
    sup.reconcile(0.0)
    launches.started[0][2].returncode = 1  # crashed
    sup.reconcile(1.0)
    assert len(launches.started) == 1  # backing off
    sup.reconcile(6.5)
    assert len(launches.started) == 2 and len(sup.running("gpt", "v1")) == 1


def test_a_worker_that_ignores_sigterm_is_killed_after_the_grace(factory: KafkaFactory) -> None:
    sup, launches = supervisor(factory)
    sup.on_record(request(2, 1))
    sup.reconcile(0.0)
    stubborn = launches.started[1][2]
    stubborn.ignore_term = True
    sup.on_record(request(1, 2))
    sup.reconcile(1.0)
    sup.reconcile(5.0)
    assert stubborn.poll() is None  # still within the grace
    sup.reconcile(11.5)
    assert stubborn.poll() == -9 and sup.stopping == []


def test_bounds_are_checked_and_the_cli_parses(factory: KafkaFactory) -> None:
    with pytest.raises(ValueError):
        ScaleSupervisor(factory, [T], max_workers=1, min_workers=2)
    assert parse_workers(["gpt=1.0.0"], ["--from-registry"]) == [
        WorkerTemplate(model="gpt", version="1.0.0", args=("--from-registry",))
    ]
    with pytest.raises(SystemExit):
        parse_workers(["gpt"], [])
    args = build_parser().parse_args(
        ["up", "--worker", "gpt=1.0.0", "--max-workers", "3", "--worker-args", "--threads 1"]
    )
    assert (args.worker, args.max_workers, args.worker_args) == (["gpt=1.0.0"], 3, "--threads 1")
    args = build_parser().parse_args(["supervise", "--worker", "gpt=1.0.0"])
    assert (args.max_workers, args.min_workers) == (2, 1)
    args = build_parser().parse_args(["policy", "--max-replicas", "3", "--scale-in-load", "0.7"])
    assert (args.max_replicas, args.scale_in_load, args.scale_cooldown_s) == (3, 0.7, 30.0)


def test_a_warm_standby_joins_on_scale_out_and_is_replaced_after_the_burst(
    factory: KafkaFactory,
) -> None:
    sup, launches = supervisor(factory, warm_standby=1, refill_delay_s=20.0)
    sup.partitions[T.key] = 6
    sup.reconcile(0.0)
    assert len(launches.started) == 1  # the first worker starts alone ...
    sup.reconcile(20.5)  # ... and the standby once it had time to warm up
    (serving, _, p1), (standby, _, p2) = launches.started
    assert "--standby" not in serving.args and standby.args[-1] == "--standby"
    assert len(sup.running("gpt", "v1")) == 1 and len(sup.standing_by("gpt", "v1")) == 1
    sup.on_record(request(2, 1))
    sup.reconcile(21.0)
    assert p2.signals == [signal.SIGUSR1] and p2.poll() is None  # activated, not restarted
    assert p1.signals == []
    assert len(launches.started) == 2 and len(sup.running("gpt", "v1")) == 2
    assert sup.standing_by("gpt", "v1") == []
    sup.reconcile(30.0)
    assert len(launches.started) == 2  # no cold start during the burst
    sup.reconcile(41.5)
    assert len(launches.started) == 3 and launches.started[2][0].args[-1] == "--standby"
    # at the bound (2 of max 2) no standby is worth keeping: it is stopped
    sup.max_workers = 2
    sup.reconcile(42.0)
    assert sup.standing_by("gpt", "v1") == [] and launches.started[2][2].signals == [signal.SIGTERM]


def test_a_standby_that_exits_is_replaced_after_the_backoff(factory: KafkaFactory) -> None:
    sup, launches = supervisor(factory, warm_standby=1, restart_backoff_s=5.0)
    sup.reconcile(0.0)
    sup.reconcile(20.5)
    launches.started[1][2].returncode = 1
    sup.reconcile(21.0)
    assert len(launches.started) == 2 and sup.standing_by("gpt", "v1") == []
    sup.reconcile(26.5)
    assert len(launches.started) == 3 and len(sup.standing_by("gpt", "v1")) == 1
    with pytest.raises(ValueError):
        ScaleSupervisor(factory, [T], max_workers=2, warm_standby=-1)
    args = build_parser().parse_args(["supervise", "--worker", "gpt=1", "--warm-standby", "1"])
    assert args.warm_standby == 1


def test_the_first_standby_may_start_with_the_first_worker(factory: KafkaFactory) -> None:
    sup, launches = supervisor(factory, warm_standby=1, first_standby_delay_s=0.0)
    sup.reconcile(5.0)
    assert [t.args[-1] for t, _, _ in launches.started] == ["1", "--standby"]
