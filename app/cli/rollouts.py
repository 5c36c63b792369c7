"""``graylane rollout``: start, watch and steer gray releases; undo to a stable revision.

A rollout is named by its id (``ro-...``) or by its model: the model's active rollout
(for ``get`` / ``status``: else its newest). ``rollout status --wait`` exits 0 once the
rollout is promoted, 1 once it is rolled back or aborted, 2 when ``--timeout`` passes
first (:data:`WAIT_EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graylane.app.cli.controlplane_calls import Sub, call, client_args, stubs
from graylane.app.cli.views import (
    add_output,
    bake_text,
    emit,
    emit_list,
    phase_name,
    print_state,
    table,
    when,
)
from graylane.rollouts.spec import DriftAction, Strategy
from graylane.rollouts.vocabulary import Phase

__all__ = ["STRATEGIES", "WAIT_EXIT_CODES", "register", "rollout_id", "steps", "wait_outcome"]


def register(sub: Sub) -> None:
    """``rollout start|get|status|list|watch|pause|resume|promote|abort|undo|history``."""
    _rollout_commands(sub)


def _rollout_ref(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "rollout",
        nargs="?",
        default="",
        metavar="ROLLOUT|MODEL",
        help="a rollout id (ro-..., from `rollout list`) or a model: its active rollout "
        "(get, status: else its newest)",
    )
    parser.add_argument("--model", default="", help="the model whose active rollout to act on")
    return parser


def _rollout_commands(sub: Sub) -> None:
    rollout = sub.add_parser("rollout", help="start and steer gray releases")
    rsub = rollout.add_subparsers(dest="rollout_command", metavar="ACTION", required=True)
    start = add_output(
        client_args(rsub.add_parser("start", help="start a rollout of a candidate version"))
    )
    start.add_argument("--model", required=True, help="the model to roll out")
    start.add_argument("--candidate", required=True, help="the candidate version")
    start.add_argument("--baseline", default="", help="default: the stable version")
    start.add_argument(
        "--strategy", choices=tuple(STRATEGIES), default="canary", help="how traffic moves"
    )
    start.add_argument("--steps", default="", help="weights in percent, e.g. 1,5,25,50,100")
    start.add_argument("--min-samples", type=int, default=0, help="per step (0: default)")
    start.add_argument("--dwell-s", type=float, default=0.0, help="per step (0: default)")
    start.add_argument(
        "--eval",
        default="",
        metavar="SET",
        help="an evaluation set (JSONL) both versions answer before traffic moves onto "
        "--eval-step; the policy engine reads it at this path",
    )
    start.add_argument(
        "--eval-step",
        type=int,
        default=2,
        help="the step (1-based) the evaluation guards (default 2: before the first move)",
    )
    start.add_argument(
        "--max-drop-vs-stable",
        type=float,
        default=0.02,
        help="how much lower than the baseline's the candidate's mean score may be",
    )
    start.add_argument(
        "--max-p99-ratio", type=float, default=0.0, help="gate: candidate/baseline p99 (0: default)"
    )
    start.add_argument(
        "--max-error-delta",
        type=float,
        default=0.0,
        help="gate: candidate minus baseline error rate (0: default)",
    )
    start.add_argument(
        "--min-agreement",
        type=float,
        default=0.0,
        help="gate: share of shadow outputs agreeing with the baseline (0: default)",
    )
    start.add_argument(
        "--length-drift",
        choices=tuple(a.value for a in DriftAction),
        default=None,
        help="what an output-length / EOS-rate drift of a generation does (default: hold)",
    )
    start.add_argument(
        "--max-length-shift",
        type=float,
        default=None,
        help="tolerated change of the share of answers longer than the baseline's median",
    )
    start.add_argument(
        "--max-eos-delta",
        type=float,
        default=None,
        help="tolerated change of the share of answers the model ended (EOS or a stop)",
    )
    start.add_argument(
        "--failures-to-rollback",
        type=int,
        default=0,
        help="failed gate evaluations in a row that roll back (0: default 2)",
    )
    start.add_argument(
        "--shadow-share", type=float, default=0.0, help="shadow strategy: share of traffic copied"
    )
    start.add_argument("--shadow-s", type=float, default=0.0, help="shadow strategy: seconds")
    start.add_argument("--ab-weight", type=float, default=0.0, help="ab strategy: percent to B")
    start.add_argument("--ab-s", type=float, default=0.0, help="ab strategy: seconds held")
    start.add_argument(
        "--bake-s",
        type=float,
        default=0.0,
        help="seconds the gates keep watching the promoted version (0: no bake period)",
    )
    start.set_defaults(handler=rollout_start)
    get = add_output(client_args(_rollout_ref(rsub.add_parser("get", help="a rollout's state"))))
    get.add_argument(
        "-w", "--watch", action="store_true", help="print it again on every change until ^C"
    )
    get.set_defaults(handler=rollout_get)
    status = add_output(
        client_args(
            _rollout_ref(
                rsub.add_parser(
                    "status",
                    help="a rollout's state; with --wait, exit 0 promoted / 1 rolled back or "
                    "aborted / 2 timeout",
                )
            )
        )
    )
    status.add_argument(
        "--wait", action="store_true", help="wait until the rollout ends; the exit code says how"
    )
    status.add_argument(
        "--timeout", type=float, default=0.0, help="with --wait: give up (exit 2) after S seconds"
    )
    status.add_argument(
        "--interval", type=float, default=1.0, help="with --wait: seconds between two looks"
    )
    status.set_defaults(handler=rollout_status)
    listing = add_output(client_args(rsub.add_parser("list", help="rollouts, newest first")))
    listing.add_argument("--model", default="", help="only this model's rollouts")
    listing.add_argument("--active", action="store_true", help="only rollouts still running")
    listing.set_defaults(handler=rollout_list)
    watch = client_args(rsub.add_parser("watch", help="stream state changes until interrupted"))
    watch.add_argument("rollout_id", nargs="?", default="", help="only this rollout")
    watch.add_argument("--model", default="", help="only this model's rollouts")
    watch.set_defaults(handler=rollout_watch)
    actions = {
        "pause": "hold the candidate at its weight",
        "resume": "continue a paused rollout",
        "promote": "the candidate to 100 % and stable, now",
        "abort": "end the rollout: the candidate to 0 %, the stable version unchanged",
    }
    for action, what in actions.items():
        p = client_args(_rollout_ref(rsub.add_parser(action, help=what)))
        p.add_argument("--reason", default="", help="recorded in the audit log")
        p.set_defaults(handler=rollout_action, action=action)
    rollback = client_args(
        _rollout_ref(rsub.add_parser("rollback", help="deprecated: use abort (or undo)"))
    )
    rollback.add_argument("--reason", default="", help="recorded in the audit log")
    rollback.set_defaults(handler=rollout_action, action="rollback")
    undo = client_args(
        rsub.add_parser(
            "undo",
            help="route 100%% back to the previous stable version (after a promotion "
            "or during a rollout), in one routing update",
        )
    )
    undo.add_argument("target", nargs="?", default="", metavar="MODEL", help="the model")
    undo.add_argument("--model", default="", help="the model (same as MODEL)")
    undo.add_argument("--reason", default="", help="recorded in the audit log")
    undo.add_argument(
        "--to-revision",
        type=int,
        default=0,
        help="go back to this stable revision (see `rollout history`); default: the previous",
    )
    undo.set_defaults(handler=rollout_undo)
    history = add_output(
        client_args(rsub.add_parser("history", help="a model's last stable versions, by revision"))
    )
    history.add_argument("target", metavar="MODEL", help="the model")
    history.set_defaults(handler=rollout_history)
    revert = client_args(rsub.add_parser("revert", help="deprecated: use undo"))
    revert.add_argument("--model", required=True, help="the model")
    revert.add_argument("--reason", default="", help="recorded in the audit log")
    revert.set_defaults(handler=rollout_undo, target="", deprecated="revert")


STRATEGIES = {
    "canary": Strategy.CANARY,
    "shadow": Strategy.SHADOW_THEN_CANARY,
    "ab": Strategy.AB_SPLIT,
}
"""The ``--strategy`` names of the CLI."""


def steps(args: argparse.Namespace) -> list[Any]:
    from graylane.v1 import rollout_pb2

    if not args.steps:
        if args.min_samples or args.dwell_s or getattr(args, "eval", ""):
            raise SystemExit("--min-samples / --dwell-s / --eval need --steps")
        return []
    try:
        weights = [float(w) for w in args.steps.split(",") if w.strip()]
    except ValueError:
        raise SystemExit(f"--steps {args.steps!r}: expected numbers like 1,5,25,50,100") from None
    out = [
        rollout_pb2.RolloutStep(
            weight_percent=w, min_samples=args.min_samples or 100, min_dwell_s=args.dwell_s or 60.0
        )
        for w in weights
    ]
    if getattr(args, "eval", ""):
        if not 1 <= args.eval_step <= len(out):
            raise SystemExit(f"--eval-step {args.eval_step}: the steps are 1..{len(out)}")
        out[args.eval_step - 1].evaluation.CopyFrom(_step_evaluation(args))
    return out


def _step_evaluation(args: argparse.Namespace) -> Any:
    """The ``--eval`` set as the spec names it: its absolute path and its sha256 now."""
    from graylane.evaluation.sets import EvalSetError, load_set
    from graylane.v1 import rollout_pb2

    path = Path(args.eval).resolve()
    try:
        digest = load_set(path).digest
    except EvalSetError as exc:
        raise SystemExit(f"--eval: {exc}") from None
    return rollout_pb2.StepEvaluation(
        set_path=str(path), max_drop_vs_stable=args.max_drop_vs_stable, set_sha256=digest
    )


def rollout_start(args: argparse.Namespace) -> int:
    from graylane.rollouts.pb import drift_action_to_pb, strategy_to_pb
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
            length_drift=(
                drift_action_to_pb(DriftAction(args.length_drift))
                if args.length_drift
                else rollout_pb2.DRIFT_ACTION_UNSPECIFIED
            ),
            max_length_shift=args.max_length_shift,
            max_eos_rate_delta=args.max_eos_delta,
        ),
        failures_to_rollback=args.failures_to_rollback,
        shadow_share=args.shadow_share,
        shadow_duration_s=args.shadow_s,
        ab_weight_percent=args.ab_weight,
        ab_duration_s=args.ab_s,
        bake_s=args.bake_s,
    )
    _emit_state(args, call(args, "Rollouts", "Start", spec))
    return 0


def _emit_state(args: argparse.Namespace, state: Any) -> None:
    emit(args, "RolloutState", state, state.rollout_id, lambda: print_state(state))


def rollout_id(args: argparse.Namespace, *, active_only: bool) -> str:
    """The rollout the command names: an id (``ro-...``, or an applied document's name),
    or a model's active rollout (``active_only=False``: else the model's newest one)."""
    from graylane.v1 import controlplane_pb2 as pb

    ref = args.rollout
    if ref and not args.model and not ref.startswith("ro-"):
        # An applied document's name is its rollout's id, whatever it looks like.
        named = call(
            args, "Rollouts", "Get", pb.GetRolloutRequest(rollout_id=ref), tolerate=("NOT_FOUND",)
        )
        if named is not None:
            return str(ref)
    model = args.model or ("" if ref.startswith("ro-") else ref)
    if not model:
        if not ref:
            raise SystemExit("name a rollout: its id (see `graylane rollout list`) or its model")
        return str(ref)
    active = call(args, "Rollouts", "List", pb.ListRolloutsRequest(model=model, active_only=True))
    if active.rollouts:
        return str(active.rollouts[0].rollout_id)
    if not active_only:
        every = call(args, "Rollouts", "List", pb.ListRolloutsRequest(model=model))
        if every.rollouts:
            return str(every.rollouts[0].rollout_id)
    which = "an active rollout" if active_only else "any rollout"
    raise SystemExit(f"model {model!r} has no {which} (see `graylane rollout list`)")


def _get_state(args: argparse.Namespace, rid: str) -> Any:
    from graylane.v1 import controlplane_pb2 as pb

    return call(args, "Rollouts", "Get", pb.GetRolloutRequest(rollout_id=rid))


def rollout_get(args: argparse.Namespace) -> int:
    rid = rollout_id(args, active_only=False)
    if not args.watch:
        _emit_state(args, _get_state(args, rid))
        return 0
    return _watch(args, rid, lambda s: _emit_state(args, s))


WAIT_EXIT_CODES: dict[Phase, int] = {
    Phase.PROMOTED: 0,
    Phase.ROLLED_BACK: 1,
    Phase.ABORTED: 1,
}
"""``rollout status --wait``: the exit code of each end; 2 when the timeout passes first."""
WAIT_TIMEOUT_EXIT = 2


def wait_outcome(phase_value: int) -> int | None:
    """The exit code once a rollout is in ``phase_value`` (a ``RolloutPhase``); ``None``
    while it still runs."""
    from graylane.rollouts.pb import phase_from_pb

    phase = phase_from_pb(phase_value)
    return WAIT_EXIT_CODES.get(phase) if phase is not None else None


def rollout_status(args: argparse.Namespace) -> int:
    rid = rollout_id(args, active_only=False)
    state = _get_state(args, rid)
    if not args.wait:
        _emit_state(args, state)
        return 0
    deadline = time.monotonic() + args.timeout if args.timeout > 0 else None
    seen = ""
    while True:
        baking = phase_name(state.phase) == "baking"
        bake = f"({bake_text(state)}) " if baking else ""
        line = (
            f"{rid} {phase_name(state.phase)} {bake}weight={state.candidate_weight_percent:g}% "
            f"{state.last_reason}"
        )
        if line != seen:
            print(line, file=sys.stderr, flush=True)
            seen = line
        outcome = wait_outcome(state.phase)
        if outcome is not None:
            _emit_state(args, state)
            return outcome
        if deadline is not None and time.monotonic() >= deadline:
            print(
                f"{rid}: still {phase_name(state.phase)} after {args.timeout:g}s", file=sys.stderr
            )
            _emit_state(args, state)
            return WAIT_TIMEOUT_EXIT
        pause = (
            args.interval if deadline is None else min(args.interval, deadline - time.monotonic())
        )
        time.sleep(max(pause, 0.0))
        state = _get_state(args, rid)


def rollout_list(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(
        args, "Rollouts", "List", pb.ListRolloutsRequest(model=args.model, active_only=args.active)
    )
    emit_list(
        args, "RolloutList", res.rollouts, lambda s: s.rollout_id, lambda: _rollout_table(res)
    )
    return 0


def _rollout_table(res: Any) -> None:
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


def rollout_watch(args: argparse.Namespace) -> int:
    def line(s: Any) -> None:
        print(
            f"{when(s.updated_at_unix_ms)} {s.rollout_id} {phase_name(s.phase)} "
            f"step={s.step_index + 1} weight={s.candidate_weight_percent:g}% "
            f"failures={s.consecutive_failures} {s.last_reason}",
            flush=True,
        )

    return _watch(args, args.rollout_id, line, model=args.model)


def _watch(
    args: argparse.Namespace, rid: str, show: Callable[[Any], None], *, model: str = ""
) -> int:
    """Show every state change of ``rid`` (or of ``model``'s rollouts) until interrupted."""
    import grpc

    from graylane.v1 import controlplane_pb2 as pb

    rpc, (channel, metadata) = stubs(args)
    stream = rpc.RolloutsStub(channel).Watch(
        pb.WatchRolloutsRequest(model=model, rollout_id=rid, initial=True),
        metadata=metadata,
    )
    try:
        for s in stream:
            show(s)
            sys.stdout.flush()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.CANCELLED:
            raise SystemExit(f"Watch: {exc.code().name}: {exc.details()}") from None
    finally:
        channel.close()
    return 0


def rollout_action(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    if args.action == "rollback":
        print(
            "graylane: `rollout rollback` is deprecated: use `rollout abort` (end the rollout, "
            "candidate to 0 %) or `rollout undo` (back to the previous stable version)",
            file=sys.stderr,
        )
    rid = rollout_id(args, active_only=True)
    receipt = call(
        args,
        "Rollouts",
        args.action.capitalize(),
        pb.RolloutActionRequest(rollout_id=rid, reason=args.reason),
    )
    print(
        f"{args.action} of {receipt.rollout_id} sent (command {receipt.command_id}); "
        f"last known phase {phase_name(receipt.state.phase)}"
    )
    return 0


def rollout_undo(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    if getattr(args, "deprecated", ""):
        print("graylane: `rollout revert` is deprecated: use `rollout undo MODEL`", file=sys.stderr)
    model = args.model or args.target
    if not model:
        raise SystemExit("name the model: graylane rollout undo MODEL")
    ask = pb.RevertRequest(
        model=model, reason=args.reason, to_revision=getattr(args, "to_revision", 0)
    )
    receipt = call(args, "Rollouts", "Revert", ask)
    how = f" (rolls back {receipt.rollout_id})" if receipt.rollout_id else ""
    print(
        f"revert of {receipt.model} to {receipt.target_version}{how} sent "
        f"(command {receipt.command_id})"
    )
    return 0


def rollout_history(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2 as pb

    res = call(args, "Rollouts", "History", pb.StableHistoryRequest(model=args.target))
    emit_list(
        args,
        "StableHistory",
        res.revisions,
        lambda r: str(r.revision),
        lambda: table(
            f"stable revisions of {args.target}",
            ["REVISION", "VERSION", "SINCE", ""],
            [
                (str(r.revision), r.version, when(r.set_at_unix_ms), "current" if r.current else "")
                for r in res.revisions
            ],
        ),
    )
    return 0
