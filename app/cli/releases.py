"""Releases as code: ``graylane apply -f``, ``graylane diff -f``, ``graylane get rollout``.

``apply`` reads Rollout documents (a file, or every ``*.yaml`` / ``*.yml`` of a folder,
``-`` for standard input), validates each against the schema with line-numbered errors
(:mod:`graylane.rollouts.manifest`), and asks the control plane to apply it: a new
name starts a rollout, the same document changes nothing, a changed one updates what
may change and is refused otherwise. A document's ``qos`` section sets the QoS policy
when it differs from the one on record. ``diff`` shows what ``apply`` would change and
exits 1 when something would (0: nothing, 2: refused or invalid), like ``kubectl diff``.
``get rollout NAME -o yaml`` prints the live rollout in the document's schema, with its
``status``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from graylane.app.cli.controlplane_calls import Sub, call, client_args

__all__ = ["read_documents", "register"]


def register(sub: Sub) -> None:
    apply = client_args(sub.add_parser("apply", help="apply Rollout documents (idempotent)"))
    apply.add_argument(
        "-f", "--filename", required=True, action="append", help="a file, a folder, or -"
    )
    apply.set_defaults(handler=apply_documents)
    diff = client_args(sub.add_parser("diff", help="what `apply -f` would change"))
    diff.add_argument(
        "-f", "--filename", required=True, action="append", help="a file, a folder, or -"
    )
    diff.set_defaults(handler=diff_documents)
    get = sub.add_parser("get", help="a live object in its document's schema")
    kinds = get.add_subparsers(dest="get_kind", metavar="KIND", required=True)
    rollout = client_args(kinds.add_parser("rollout", help="a rollout as a Rollout document"))
    rollout.add_argument("name", help="the rollout's name (metadata.name) or id")
    rollout.add_argument(
        "-o", "--output", choices=["yaml", "json"], default="yaml", help="yaml (default) or json"
    )
    rollout.set_defaults(handler=get_rollout)


def _paths(names: list[str]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for name in names:
        if name == "-":
            out.append(("<stdin>", sys.stdin.read()))
            continue
        path = Path(name)
        if path.is_dir():
            files = sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
            out += [(str(p), p.read_text(encoding="utf-8")) for p in files]
        elif path.is_file():
            out.append((str(path), path.read_text(encoding="utf-8")))
        else:
            raise SystemExit(f"graylane: {name}: no such file or folder")
    return out


def read_documents(names: list[str]) -> list[Any]:
    """Every Rollout document of the named files and folders; exits 2 listing every problem."""
    from graylane.rollouts.manifest import ManifestInvalid, load_documents

    docs: list[Any] = []
    problems: list[str] = []
    for source, text in _paths(names):
        try:
            docs += load_documents(text, source)
        except ManifestInvalid as exc:
            problems += [str(p) for p in exc.problems]
    if problems:
        print("\n".join(problems), file=sys.stderr)
        raise SystemExit(2)
    names_seen = [d.name for d in docs]
    twice = sorted({n for n in names_seen if names_seen.count(n) > 1})
    if twice:
        raise SystemExit(f"graylane: rollouts named twice: {', '.join(twice)}")
    return docs


def _request(doc: Any) -> Any:
    from graylane.rollouts.pb import rollout_spec_to_pb
    from graylane.v1 import controlplane_pb2

    return controlplane_pb2.ApplyRolloutRequest(spec=rollout_spec_to_pb(doc.spec))


def _qos_differs(args: argparse.Namespace, doc: Any) -> Any:
    """The QoS policy of the document when the one on record differs, else None."""
    from dataclasses import replace

    from graylane.rollouts.pb import qos_policy_from_pb, qos_policy_to_pb
    from graylane.v1 import controlplane_pb2

    if doc.qos is None:
        return None
    ask = controlplane_pb2.GetQosPolicyRequest(model=doc.qos.model, version=doc.qos.version)
    view = call(args, "Qos", "GetPolicy", ask, tolerate=("NOT_FOUND",))
    # the rungs' measured costs are the control plane's to fill in, not the document's
    if (
        view is not None
        and view.HasField("policy")
        and (
            replace(qos_policy_from_pb(view.policy), rung_quality_drop=())
            == replace(doc.qos, rung_quality_drop=())
        )
    ):
        return None
    return qos_policy_to_pb(doc.qos)


def _show_changes(name: str, response: Any) -> None:
    for c in response.changes:
        mark = "" if c.allowed else "   (may not change)"
        print(f"  {name}: {c.field}: {c.live} -> {c.applied}{mark}")


def apply_documents(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2

    outcomes = {
        controlplane_pb2.APPLY_CREATED: "created",
        controlplane_pb2.APPLY_UNCHANGED: "unchanged",
        controlplane_pb2.APPLY_UPDATED: "updated",
    }
    for doc in read_documents(args.filename):
        response = call(args, "Rollouts", "Apply", _request(doc))
        print(f"rollout/{doc.name} {outcomes.get(response.outcome, '?')} ({doc.digest[:19]})")
        _show_changes(doc.name, response)
        policy = _qos_differs(args, doc)
        if policy is not None:
            call(args, "Qos", "SetPolicy", policy)
            print(f"qos/{policy.model}/{policy.version} set")
    return 0


def diff_documents(args: argparse.Namespace) -> int:
    from graylane.v1 import controlplane_pb2

    changed = refused = False
    for doc in read_documents(args.filename):
        response = call(args, "Rollouts", "Diff", _request(doc))
        if response.outcome == controlplane_pb2.APPLY_CREATED:
            print(f"rollout/{doc.name}: would start ({doc.spec.model} {doc.spec.candidate})")
            changed = True
        elif response.outcome == controlplane_pb2.APPLY_UNCHANGED:
            print(f"rollout/{doc.name}: unchanged")
        else:
            would = "refused" if response.outcome == controlplane_pb2.APPLY_REFUSED else "update"
            print(f"rollout/{doc.name}: would {would}")
            _show_changes(doc.name, response)
            changed = True
            refused |= response.outcome == controlplane_pb2.APPLY_REFUSED
        if doc.qos is not None and _qos_differs(args, doc) is not None:
            print(f"qos/{doc.qos.model}/{doc.qos.version}: would be set")
            changed = True
    return 2 if refused else 1 if changed else 0


def get_rollout(args: argparse.Namespace) -> int:
    import json

    import yaml

    from graylane.clock import now_ms
    from graylane.rollouts.manifest import render
    from graylane.rollouts.pb import phase_from_pb, qos_policy_from_pb, rollout_spec_from_pb
    from graylane.rollouts.vocabulary import Phase
    from graylane.v1 import controlplane_pb2

    state = call(args, "Rollouts", "Get", controlplane_pb2.GetRolloutRequest(rollout_id=args.name))
    spec = rollout_spec_from_pb(state.spec)
    ask = controlplane_pb2.GetQosPolicyRequest(model=spec.model, version=spec.candidate)
    view = call(args, "Qos", "GetPolicy", ask, tolerate=("NOT_FOUND",))
    qos = qos_policy_from_pb(view.policy) if view is not None and view.HasField("policy") else None
    phase = phase_from_pb(state.phase)
    status = {
        "phase": phase.value if phase is not None else "unknown",
        "step": state.step_index + 1,
        "candidateWeight": state.candidate_weight_percent,
        "lastReason": state.last_reason,
        "updatedAtMs": state.updated_at_unix_ms,
        "documentDigest": spec.document_digest,
    }
    if phase is Phase.BAKING:
        status["bakeUntilMs"] = state.bake_until_unix_ms
        status["bakeLeftS"] = round(max(0, state.bake_until_unix_ms - now_ms()) / 1000)
    text = render(spec, qos=qos, status=status)
    if args.output == "json":
        text = json.dumps(yaml.safe_load(text), indent=2) + "\n"
    sys.stdout.write(text)
    return 0
