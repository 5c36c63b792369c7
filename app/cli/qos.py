"""``graylane qos``: a model version's elastic precision policy, set and shown."""

from __future__ import annotations

import argparse

from graylane.app.cli.controlplane_calls import Sub, call, client_args
from graylane.app.cli.views import add_output, emit, print_policy

__all__ = ["register"]


def register(sub: Sub) -> None:
    """``qos set|status``."""
    _qos_commands(sub)


def _qos_commands(sub: Sub) -> None:
    qos = sub.add_parser("qos", help="elastic precision policies")
    qsub = qos.add_subparsers(dest="qos_command", metavar="ACTION", required=True)
    qset = client_args(qsub.add_parser("set", help="set the QoS policy of a model version"))
    qset.add_argument("--model", required=True, help="the model")
    qset.add_argument("--version", required=True, help="the model version")
    qset.add_argument(
        "--slo-ms", type=float, default=0.0, help="p99 whole-request latency objective"
    )
    qset.add_argument(
        "--slo-ttft-ms", type=float, default=0.0, help="generative: p99 time to first token"
    )
    qset.add_argument(
        "--slo-tpot-ms", type=float, default=0.0, help="generative: p99 time per output token"
    )
    qset.add_argument(
        "--max-waiting",
        type=float,
        default=0.0,
        help="generative: waiting sequences per worker that breach "
        "(default: capacity x TTFT objective, else the Inference Extension's 5)",
    )
    qset.add_argument(
        "--max-kv-cache",
        type=float,
        default=0.0,
        help="generative: KV-cache occupancy that breaches (default 0.8)",
    )
    qset.add_argument("--ladder", required=True, help="variants, quality first: fp32,fp16,int8")
    qset.add_argument("--floor", default="", help="lowest variant allowed")
    qset.add_argument(
        "--sustain-s", type=float, default=0.0, help="p99 must hold this long to step (0: default)"
    )
    qset.add_argument(
        "--min-dwell-s", type=float, default=0.0, help="least time on a rung (0: default)"
    )
    qset.add_argument(
        "--max-queue-wait-ms",
        type=float,
        default=0.0,
        help="step down when queue wait passes this (0: off)",
    )
    qset.add_argument(
        "--capacity",
        action="append",
        default=[],
        metavar="VARIANT=RPS",
        help="one worker's capacity of a rung (default: this host's `graylane calibrate`)",
    )
    qset.add_argument(
        "--up-capacity-fraction",
        type=float,
        default=0.0,
        help="step up once the load is below this share of the rung above's capacity (0.7)",
    )
    qset.add_argument(
        "--max-quality-drop",
        type=float,
        default=None,
        help="never step onto a rung whose measured quality drop (reference score - its "
        "score, `graylane eval --record`) exceeds this (default: no cap)",
    )
    qset.add_argument(
        "--refuse-unmeasured",
        action="store_true",
        help="under --max-quality-drop, refuse rungs with no measurement too "
        "(default: allowed, shown as unmeasured)",
    )
    qset.add_argument("--disabled", action="store_true", help="store the policy but do not act")
    qset.set_defaults(handler=qos_set)
    qstatus = add_output(
        client_args(qsub.add_parser("status", help="the policy and the active variant"))
    )
    qstatus.add_argument("--model", required=True, help="the model")
    qstatus.add_argument("--version", required=True, help="the model version")
    qstatus.set_defaults(handler=qos_status)


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
    if max(args.slo_ms, args.slo_ttft_ms, args.slo_tpot_ms) <= 0.0:
        raise SystemExit("state an objective: --slo-ms, --slo-ttft-ms and/or --slo-tpot-ms")
    policy = rollout_pb2.QosPolicy(
        model=args.model,
        version=args.version,
        slo_p99_ms=args.slo_ms,
        slo_ttft_p99_ms=args.slo_ttft_ms,
        slo_tpot_p99_ms=args.slo_tpot_ms,
        max_waiting_sequences=args.max_waiting,
        max_kv_cache_occupancy=args.max_kv_cache,
        ladder=ladder,
        quality_floor=args.floor,
        sustain_s=args.sustain_s,
        min_dwell_s=args.min_dwell_s,
        max_queue_wait_ms=args.max_queue_wait_ms,
        enabled=not args.disabled,
        rung_capacity_rps=_rung_capacities(args, ladder),
        up_capacity_fraction=args.up_capacity_fraction,
        unmeasured_rung=rollout_pb2.UNMEASURED_RUNG_REFUSED
        if args.refuse_unmeasured
        else rollout_pb2.UNMEASURED_RUNG_ALLOWED,
    )
    if args.max_quality_drop is not None:
        policy.max_quality_drop = args.max_quality_drop
    elif args.refuse_unmeasured:
        raise SystemExit("--refuse-unmeasured needs --max-quality-drop")
    print_policy(call(args, "Qos", "SetPolicy", policy))
    return 0


def qos_status(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    view = call(
        args, "Qos", "GetPolicy", pb.GetQosPolicyRequest(model=args.model, version=args.version)
    )
    emit(args, "QosPolicyView", view, f"{args.model}/{args.version}", lambda: print_policy(view))
    return 0
