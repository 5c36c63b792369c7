"""``graylane eval``: an evaluation set run against versions, engine endpoints or the gateway.

    graylane eval SET.jsonl --version smollm2=1.0.0 --version smollm2=1.1.0
    graylane eval SET.jsonl --endpoint q4_1=http://127.0.0.1:8081 --endpoint q4_0=http://...
    graylane eval SET.jsonl --gateway http://127.0.0.1:8080 --model smollm2 --key KEY

Each target answers every item (greedy), scored by the item's expectation; a progress
line per target while it runs, then a table (score, 95 % interval, passes, failed calls)
and every other target against the first one (difference, 95 % interval, paired
permutation p-value), a plot of the scores with their intervals, and one JSON line.
Exit 0; 1 when a target could not be asked at all.

``--record MODEL=VERSION`` stores each rung's score in the registry (through the control
plane) as the measured quality of that precision rung of the version:

    graylane eval SET.jsonl --record smollm2=1.0.0 \
        --endpoint f16=http://127.0.0.1:8081 --endpoint q4_0=http://127.0.0.1:8082

Each target is then a rung named by its precision (``--endpoint PRECISION=URL``); the
first is the reference (the version's top rung), and a rung's quality cost is the
reference's score minus its own, on the same items. A target with failed calls is not
recorded (its score is not its answers'). With ``--limit N`` the set is recorded as
``NAME[:N]`` with the digest of the set's digest and N. ``graylane model show`` lists
the scores and costs; a QoS policy's ``--max-quality-drop`` caps them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ev = sub.add_parser(
        "eval", help="score versions, engine endpoints or the gateway on an evaluation set"
    )
    ev.add_argument("set", type=Path, help="the evaluation set (JSONL)")
    ev.add_argument(
        "--version",
        action="append",
        default=[],
        metavar="MODEL=VERSION",
        help="a model version over Kafka, straight to its version topic (repeatable)",
    )
    ev.add_argument(
        "--endpoint",
        action="append",
        default=[],
        metavar="NAME=URL",
        help="an OpenAI-compatible endpoint (an engine server: one rung of a ladder)",
    )
    ev.add_argument("--gateway", default="", help="the gateway's URL (with --model, --key)")
    ev.add_argument("--model", default="", help="the model the gateway or an endpoint is asked")
    ev.add_argument("--key", default="", help="the gateway's API key (or GRAYLANE_API_KEY)")
    ev.add_argument("--judge", default="", help="an OpenAI-compatible endpoint that grades")
    ev.add_argument("--judge-model", default="", help="the judge's model")
    ev.add_argument("--concurrency", type=int, default=4, help="calls at once per target")
    ev.add_argument("--limit", type=int, default=0, help="only the first N items (0 = all)")
    ev.add_argument(
        "--plot", type=Path, default=Path(".local/eval.png"), help="where the plot goes"
    )
    ev.add_argument(
        "--record",
        default="",
        metavar="MODEL=VERSION",
        help="store each rung's score as the version's measured rung quality (targets named "
        "by precision; the first is the reference)",
    )
    from graylane.app.cli.controlplane_calls import client_args

    client_args(ev)
    ev.set_defaults(handler=_eval)


def _pairs(items: list[str], what: str) -> list[tuple[str, str]]:
    pairs = []
    for item in items:
        name, _, value = item.partition("=")
        if not name or not value:
            raise SystemExit(f"{what} {item!r}: expected NAME=VALUE")
        pairs.append((name, value))
    return pairs


def _eval(args: argparse.Namespace) -> int:
    return asyncio.run(_run(args))


async def _run(args: argparse.Namespace) -> int:
    import os

    import httpx

    from graylane.client import GraylaneClient
    from graylane.evaluation.runner import (
        EvalTarget,
        Judge,
        OpenAITarget,
        VersionTarget,
        answer_all,
        score_all,
    )
    from graylane.evaluation.sets import EvalSetError, load_set
    from graylane.evaluation.summary import compare, summarize
    from graylane.settings import Settings

    try:
        evaluation = load_set(args.set)
    except EvalSetError as exc:
        raise SystemExit(str(exc)) from None
    items = evaluation.items[: args.limit] if args.limit > 0 else evaluation.items
    clients: list[httpx.AsyncClient] = []
    targets: list[EvalTarget] = []
    kafka: GraylaneClient | None = None
    if args.version:
        kafka = GraylaneClient(Settings.from_env())
        await kafka.start()
        for model, version in _pairs(args.version, "--version"):
            targets.append(VersionTarget(kafka, model, version))
    for name, url in _pairs(args.endpoint, "--endpoint"):
        http = httpx.AsyncClient(base_url=url, timeout=120, trust_env=False)
        clients.append(http)
        targets.append(OpenAITarget(name, http, args.model))
    if args.gateway:
        key = args.key or os.environ.get("GRAYLANE_API_KEY", "")
        http = httpx.AsyncClient(
            base_url=args.gateway,
            timeout=120,
            trust_env=False,
            headers={"Authorization": f"Bearer {key}"} if key else {},
        )
        clients.append(http)
        targets.append(OpenAITarget(f"gateway {args.model}", http, args.model))
    if not targets:
        raise SystemExit("name what to score: --version, --endpoint or --gateway")
    record = _record_target(args, [t.name for t in targets])
    judge = None
    if args.judge:
        judge_http = httpx.AsyncClient(base_url=args.judge, timeout=120, trust_env=False)
        clients.append(judge_http)
        judge = Judge(judge_http, args.judge_model)
    print(f"{evaluation.name}: {len(items)} items (sha256 {evaluation.digest[:12]})", flush=True)
    results: dict[str, Any] = {}
    summaries = []
    try:
        for target in targets:
            answers = await answer_all(
                target,
                items,
                concurrency=args.concurrency,
                progress=_Progress(target.name, len(items)),
            )
            scores = await score_all(answers, judge)
            results[target.name] = scores
            summaries.append(summarize(target.name, scores))
    finally:
        for http in clients:
            await http.aclose()
        if kafka is not None:
            await kafka.close()
    first = summaries[0].target
    comparisons = [
        compare(first, results[first], s.target, results[s.target]) for s in summaries[1:]
    ]
    _table(summaries, comparisons)
    path = _plot(summaries, evaluation.name, args.plot)
    print(f"plot: {path}", flush=True)
    line = {
        "set": evaluation.name,
        "set_sha256": evaluation.digest,
        "items": len(items),
        "targets": {
            s.target: {
                "score": round(s.mean, 4),
                "ci": [round(s.ci_low, 4), round(s.ci_high, 4)],
                "passed": s.passed,
                "errors": s.errors,
            }
            for s in summaries
        },
        "against_first": {
            c.candidate: {
                "difference": round(c.difference, 4),
                "ci": [round(c.ci_low, 4), round(c.ci_high, 4)],
                "p_value": round(c.p_value, 5),
            }
            for c in comparisons
        },
    }
    print(json.dumps(line), flush=True)
    if record is not None:
        limited = len(items) < len(evaluation.items)
        _record(
            args,
            record,
            summaries,
            set_name=f"{evaluation.name}[:{len(items)}]" if limited else evaluation.name,
            set_sha256=subset_digest(evaluation.digest, len(items))
            if limited
            else evaluation.digest,
        )
    return 1 if any(s.errors == s.items for s in summaries) else 0


def subset_digest(digest: str, items: int) -> str:
    """The digest a set's first ``items`` items are recorded under."""
    import hashlib

    return hashlib.sha256(f"{digest}:{items}".encode()).hexdigest()


def _record_target(args: argparse.Namespace, names: list[str]) -> tuple[str, str] | None:
    """(model, version) of ``--record``, with every target named by a precision."""
    from graylane.artifacts.naming import Precision

    if not args.record:
        return None
    (pair,) = _pairs([args.record], "--record")
    if args.version or args.gateway:
        raise SystemExit("--record scores rungs: name each with --endpoint PRECISION=URL")
    known = {p.value for p in Precision}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(
            f"--record: {', '.join(unknown)} is not a precision; name each rung by its "
            f"precision ({', '.join(sorted(known))})"
        )
    return pair


def _record(
    args: argparse.Namespace,
    record: tuple[str, str],
    summaries: list[Any],
    *,
    set_name: str,
    set_sha256: str,
) -> None:
    from graylane.app.cli.controlplane_calls import call
    from graylane.v1 import controlplane_pb2 as pb

    model, version = record
    reference = summaries[0]
    if reference.errors:
        raise SystemExit(
            f"--record: the reference {reference.target} had {reference.errors} failed calls; "
            "nothing recorded"
        )
    rungs = []
    for s in summaries:
        if s.errors:
            print(f"not recorded: {s.target} ({s.errors} failed calls)", flush=True)
            continue
        rungs.append(
            pb.RungQualityInfo(
                precision=s.target,
                set_name=set_name,
                set_sha256=set_sha256,
                items=s.items,
                score=s.mean,
                ci_low=s.ci_low,
                ci_high=s.ci_high,
                reference_precision=reference.target,
                reference_score=reference.mean,
            )
        )
    res = call(
        args,
        "ModelRegistry",
        "RecordRungQuality",
        pb.RecordRungQualityRequest(model=model, version=version, rungs=rungs),
    )
    for q in res.recorded:
        print(
            f"recorded {model} {version} {q.precision}: {q.score:.3f} "
            f"({q.ci_low:.3f}..{q.ci_high:.3f}), cost {q.reference_score - q.score:+.3f} "
            f"vs {q.reference_precision}",
            flush=True,
        )
    if res.command_id:
        print(f"QoS policy of {model} {version} sent again with the costs ({res.command_id})")


class _Progress:
    """A line every ten answers of a target."""

    def __init__(self, name: str, total: int) -> None:
        self.name, self.total, self.done = name, total, 0

    def __call__(self, _: object) -> None:
        self.done += 1
        if self.done % 10 == 0 or self.done == self.total:
            print(f"  {self.name}: {self.done}/{self.total} answered", flush=True)


def _table(summaries: list[Any], comparisons: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="scores (mean item score, 95 % interval)")
    for head in ("target", "items", "score", "95 % interval", "passed", "failed calls"):
        table.add_column(head, justify="right" if head != "target" else "left")
    for s in summaries:
        table.add_row(
            s.target,
            str(s.items),
            f"{s.mean:.3f}",
            f"{s.ci_low:.3f} .. {s.ci_high:.3f}",
            str(s.passed),
            str(s.errors),
        )
    console = Console(width=None if sys.stdout.isatty() else 132)
    console.print(table)
    if comparisons:
        versus = Table(title=f"against {comparisons[0].baseline} (same items, paired)")
        for head in ("target", "difference", "95 % interval", "p"):
            versus.add_column(head, justify="right" if head != "target" else "left")
        for c in comparisons:
            versus.add_row(
                c.candidate,
                f"{c.difference:+.3f}",
                f"{c.ci_low:+.3f} .. {c.ci_high:+.3f}",
                f"{c.p_value:.4f}",
            )
        console.print(versus)


def _plot(summaries: list[Any], name: str, path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(summaries) + 2), 4.0))
    xs = range(len(summaries))
    means = [s.mean for s in summaries]
    errors = [[s.mean - s.ci_low for s in summaries], [s.ci_high - s.mean for s in summaries]]
    ax.bar(xs, means, yerr=errors, capsize=6, color="#4c78a8")
    ax.set_xticks(list(xs), [s.target for s in summaries], rotation=15, ha="right")
    ax.set_ylim(0, 1)
    ax.set_ylabel("mean item score (95 % interval)")
    ax.set_title(f"{name}: {summaries[0].items} items")
    for x, summary in zip(xs, summaries, strict=True):
        # the figure sits inside the bar's foot, clear of the interval's whiskers
        inside = summary.mean >= 0.12
        ax.text(
            x,
            0.03 if inside else summary.ci_high + 0.03,
            f"{summary.mean:.2f}",
            ha="center",
            va="bottom",
            fontsize=9,
            color="white" if inside else "black",
        )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
