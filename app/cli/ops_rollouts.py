"""``graylane rollout ...`` and ``graylane qos ...``: start, watch and steer rollouts; set QoS."""

from __future__ import annotations

import argparse
from typing import Any

from graylane.app.cli.ops_client import call, stubs
from graylane.app.cli.ops_views import phase_name, print_policy, print_state, table, when
from graylane.rollouts.spec import Strategy

__all__ = [
    "STRATEGIES",
    "qos_set",
    "qos_status",
    "rollout_action",
    "rollout_list",
    "rollout_revert",
    "rollout_start",
    "rollout_status",
    "rollout_watch",
]

STRATEGIES = {
    "canary": Strategy.CANARY,
    "shadow": Strategy.SHADOW_THEN_CANARY,
    "ab": Strategy.AB_SPLIT,
}
"""The ``--strategy`` names of the CLI."""


def steps(args: argparse.Namespace) -> list[Any]:
    from graylane.v1 import rollout_pb2

    if not args.steps:
        if args.min_samples or args.dwell_s:
            raise SystemExit("--min-samples / --dwell-s need --steps")
        return []
    try:
        weights = [float(w) for w in args.steps.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--steps {args.steps!r}: expected numbers like 1,5,25,50,100") from None
    return [
        rollout_pb2.RolloutStep(
            weight_percent=w, min_samples=args.min_samples or 100, min_dwell_s=args.dwell_s or 60.0
        )
        for w in weights
    ]


def rollout_start(args: argparse.Namespace) -> int:
    from graylane.rollouts.pb import strategy_to_pb
    from graylane.v1 import rollout_pb2

    spec = rollout_pb2.RolloutSpec(
        model=args.model,
        baseline_version=args.baseline,
        candidate_version=args.candidate,
        strategy=strategy_to_pb(STRATEGIES[args.strategy]),
        steps=steps(args),
        gates=rollout_pb2.GateSpec(
            max_p99_ratio=args.max_p99_ratio,
            max_error_rate_delta=args.max_error_delta,
            min_output_agreement=args.min_agreement,
        ),
        failures_to_rollback=args.failures_to_rollback,
        shadow_share=args.shadow_share,
        shadow_duration_s=args.shadow_s,
        ab_weight_percent=args.ab_weight,
        ab_duration_s=args.ab_s,
    )
    print_state(call(args, "Rollouts", "Start", spec))
    return 0


def rollout_status(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    print_state(call(args, "Rollouts", "Get", pb.GetRolloutRequest(rollout_id=args.rollout_id)))
    return 0


def rollout_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(
        args, "Rollouts", "List", pb.ListRolloutsRequest(model=args.model, active_only=args.active)
    )
    table(
        "rollouts",
        ("rollout", "model", "versions", "phase", "weight", "updated", "reason"),
        [
            (
                s.rollout_id,
                s.model,
                f"{s.spec.baseline_version} -> {s.spec.candidate_version}",
                phase_name(s.phase),
                f"{s.candidate_weight_percent:g}%",
                when(s.updated_at_unix_ms),
                s.last_reason,
            )
            for s in res.rollouts
        ],
    )
    return 0


def rollout_watch(args: argparse.Namespace) -> int:
    import grpc

    from graylane.v1 import controlplane_pb2 as pb

    rpc, (channel, metadata) = stubs(args)
    stream = rpc.RolloutsStub(channel).Watch(
        pb.WatchRolloutsRequest(model=args.model, rollout_id=args.rollout_id, initial=True),
        metadata=metadata,
    )
    try:
        for s in stream:
            print(
                f"{when(s.updated_at_unix_ms)} {s.rollout_id} {phase_name(s.phase)} "
                f"step={s.step_index + 1} weight={s.candidate_weight_percent:g}% "
                f"failures={s.consecutive_failures} {s.last_reason}",
                flush=True,
            )
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise SystemExit(f"Watch: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    return 0


def rollout_action(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    receipt = call(
        args,
        "Rollouts",
        args.action.capitalize(),
        pb.RolloutActionRequest(rollout_id=args.rollout_id, reason=args.reason),
    )
    print(
        f"{args.action} of {receipt.rollout_id} sent (command {receipt.command_id}); "
        f"last known phase {phase_name(receipt.state.phase)}"
    )
    return 0


def rollout_revert(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    receipt = call(
        args, "Rollouts", "Revert", pb.RevertRequest(model=args.model, reason=args.reason)
    )
    how = f" (rolls back {receipt.rollout_id})" if receipt.rollout_id else ""
    print(
        f"revert of {receipt.model} to {receipt.target_version}{how} sent "
        f"(command {receipt.command_id})"
    )
    return 0


def _rung_capacities(args: argparse.Namespace, ladder: list[str]) -> dict[str, float]:
    """``--capacity`` as given, else this host's calibration of the version (if any)."""
    from graylane.capacity import load_profile, rung_capacities, this_host
    from graylane.settings import Settings

    if args.capacity:
        given: dict[str, float] = {}
        for item in args.capacity:
            name, _, rps = item.partition("=")
            try:
                given[name.strip()] = float(rps)
            except ValueError:
                raise SystemExit(f"--capacity {item!r}: expected VARIANT=RPS") from None
        return given
    profile = load_profile(Settings.from_env().artifact_dir, args.model, args.version)
    if profile is None or profile.host != this_host():
        return {}
    return dict(rung_capacities(profile, ladder))


def qos_set(args: argparse.Namespace) -> int:
    from graylane.v1 import rollout_pb2

    ladder = [x.strip() for x in args.ladder.split(",") if x.strip()]
    policy = rollout_pb2.QosPolicy(
        model=args.model,
        version=args.version,
        slo_p99_ms=args.slo_ms,
        ladder=ladder,
        quality_floor=args.floor,
        sustain_s=args.sustain_s,
        min_dwell_s=args.min_dwell_s,
        max_queue_wait_ms=args.max_queue_wait_ms,
        enabled=not args.disabled,
        rung_capacity_rps=_rung_capacities(args, ladder),
        up_capacity_fraction=args.up_capacity_fraction,
    )
    print_policy(call(args, "Qos", "SetPolicy", policy))
    return 0


def qos_status(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    print_policy(
        call(
            args, "Qos", "GetPolicy", pb.GetQosPolicyRequest(model=args.model, version=args.version)
        )
    )
    return 0
