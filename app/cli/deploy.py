"""``graylane deploy render``: a version's worker manifests from the registry."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["register"]


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    deploy = sub.add_parser("deploy", help="Kubernetes manifests")
    dsub = deploy.add_subparsers(dest="deploy_command", metavar="ACTION", required=True)
    render = dsub.add_parser(
        "render",
        help="write the worker Deployment, KEDA ScaledObject and PodDisruptionBudget of a "
        "registered version",
    )
    render.add_argument("--model", required=True, help="the model")
    render.add_argument("--version", required=True, help="the model version")
    render.add_argument(
        "--gpu",
        action="store_true",
        help="a TensorRT worker on every GPU compute capability the version's engines were "
        "built for (one Deployment; the engine is picked at start); default CPU",
    )
    render.add_argument("--out", type=Path, default=Path("."), help="folder to write into")
    render.add_argument("--namespace", default="graylane", help="Kubernetes namespace")
    render.add_argument(
        "--image-registry", default="ghcr.io/graylane", help="where the images are pulled from"
    )
    render.add_argument("--max-replicas", type=int, default=0, help="default: the partitions")
    render.add_argument(
        "--bootstrap-servers",
        default="kafka-bootstrap.kafka.svc:9092",
        help="Kafka bootstrap servers seen from the cluster",
    )
    render.add_argument(
        "--prometheus-url",
        default="http://prometheus.monitoring.svc:9090",
        help="Prometheus that KEDA queries",
    )
    render.set_defaults(handler=_render)


def _render(args: argparse.Namespace) -> int:
    import yaml

    from graylane.app.k8s.workers import (
        NothingToDeploy,
        plan_from_registry,
        worker_manifests,
    )
    from graylane.registry.records import RegistryError
    from graylane.registry.repository import open_registry
    from graylane.settings import Settings
    from graylane.topics import TopicLayout

    settings = Settings.from_env()
    max_replicas = args.max_replicas or settings.partitions
    if max_replicas > settings.partitions:
        raise SystemExit(
            f"--max-replicas {max_replicas} > {settings.partitions} partitions: the extra "
            "replicas would sit idle"
        )
    registry = open_registry(settings.db_url)
    try:
        plan = plan_from_registry(
            registry,
            args.model,
            args.version,
            gpu=args.gpu,
            layout=TopicLayout(prefix=settings.topic_prefix, partitions=settings.partitions),
            image_registry=args.image_registry,
            max_replicas=max_replicas,
            bootstrap_servers=args.bootstrap_servers,
            prometheus_url=args.prometheus_url,
        )
    except (NothingToDeploy, RegistryError) as exc:
        raise SystemExit(f"graylane deploy render: {exc}") from None
    finally:
        registry.engine.dispose()
    docs = worker_manifests(plan, args.namespace)
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{plan.name}.yaml"
    header = (
        f"# {plan.model} {plan.version}: worker Deployment, KEDA ScaledObject and "
        f"PodDisruptionBudget\n# rendered by `graylane deploy render` from the registry; "
        f"variants: {', '.join(plan.variants)}\n"
    )
    path.write_text(header + yaml.safe_dump_all(docs, sort_keys=False))
    print(f"wrote {path} ({plan.image}, variants {', '.join(plan.variants)})")
    return 0
