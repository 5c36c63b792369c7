"""docker-compose.yml cannot run here (no Docker engine); check it statically."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from graylane.app.cli.main import LEGACY_SERVER_COMMANDS, build_parser

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, dict[str, object]] = COMPOSE["services"]
THIRD_PARTY = {"kafka", "prometheus", "grafana", "vllm"}
GRAYLANE = [n for n in SERVICES if n not in THIRD_PARTY]
BUILDERS = [n for n in GRAYLANE if n.startswith("build-")]
GPU_PROFILE = "gpu"


def _depends(service: dict[str, object]) -> list[str]:
    deps = service.get("depends_on") or {}
    return list(deps) if isinstance(deps, dict | list) else []


def _profiles(service: dict[str, object]) -> list[str]:
    profiles = service.get("profiles") or []
    assert isinstance(profiles, list)
    return [str(p) for p in profiles]


def _flag(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_kafka_is_the_official_image_in_kraft_mode() -> None:
    kafka = SERVICES["kafka"]
    assert str(kafka["image"]).startswith("apache/kafka:4.")
    env = kafka["environment"]
    assert isinstance(env, dict)
    assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"


def test_dependencies_exist_and_have_no_cycle() -> None:
    for name, service in SERVICES.items():
        for dep in _depends(service):
            assert dep in SERVICES, f"{name} depends on unknown service {dep}"
    visiting: set[str] = set()
    done: set[str] = set()

    def visit(name: str) -> None:
        assert name not in visiting, f"dependency cycle through {name}"
        if name in done:
            return
        visiting.add(name)
        for dep in _depends(SERVICES[name]):
            visit(dep)
        visiting.discard(name)
        done.add(name)

    for name in SERVICES:
        visit(name)


def test_every_graylane_service_reaches_kafka() -> None:
    def reaches(name: str) -> bool:
        return name == "kafka" or any(reaches(d) for d in _depends(SERVICES[name]))

    for name, service in SERVICES.items():
        if name in THIRD_PARTY or name in BUILDERS:
            continue
        assert reaches(name), f"{name} does not wait for kafka"
        env = service["environment"]
        assert isinstance(env, dict) and env["GRAYLANE_BOOTSTRAP_SERVERS"] == "kafka:9092"


@pytest.mark.parametrize("name", GRAYLANE)
def test_every_service_command_exists_in_the_project(name: str) -> None:
    command = SERVICES[name]["command"]
    assert isinstance(command, list) and command[0] == "graylane"
    assert command[1] not in LEGACY_SERVER_COMMANDS, command  # servers: graylane serve ...
    args = build_parser().parse_args(command[1:])  # exits (fails) on an unknown command
    assert callable(args.handler)


def test_the_image_is_built_from_the_project() -> None:
    dockerfile = ROOT / "deploy" / "docker" / "Dockerfile"
    assert dockerfile.exists()
    for line in dockerfile.read_text().splitlines():
        if line.startswith("COPY ") and not line.split()[1].startswith("--from="):
            for src in line.split()[1:-1]:
                assert (ROOT / src).exists(), f"Dockerfile copies missing {src}"


def test_every_image_port_and_volume_referenced_exists() -> None:
    declared = set(COMPOSE.get("volumes") or {})
    for name, service in SERVICES.items():
        image = str(service["image"])
        if name in GRAYLANE:
            assert image == "graylane:local" and "build" in service, name
        else:
            assert ":" in image and not image.endswith(":latest"), f"{name}: pin {image}"
        for volume in service.get("volumes") or []:  # type: ignore[attr-defined]
            source = str(volume).split(":", 1)[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
            else:
                assert source in declared, f"{name} uses undeclared volume {source}"
        for port in service.get("ports") or []:  # type: ignore[attr-defined]
            container_port = int(str(port).rsplit(":", 1)[1])
            expected = {"kafka": 9092, "prometheus": 9090, "grafana": 3000, "gateway": 8080}.get(
                name, 50051
            )
            assert container_port == expected, f"{name} publishes {port}"


def test_versions_are_semver_built_by_the_builder_and_rolled_out_with_qos() -> None:
    from graylane.artifacts.naming import parse_semver
    from graylane.builder.spec import load_spec

    built: dict[str, set[str]] = {}
    for name in BUILDERS:
        command = SERVICES[name]["command"]
        assert isinstance(command, list)
        spec = load_spec(ROOT / "deploy/compose/specs" / Path(command[-1]).name)
        built[str(spec.version)] = {p.value for p in spec.precisions}
        parse_semver(str(spec.version))
    workers = [n for n in GRAYLANE if n.startswith("worker-")]
    for name in workers:
        command = SERVICES[name]["command"]
        assert isinstance(command, list)
        if "--endpoint" in command:  # an engine server serves it: nothing to build
            continue
        assert "--from-registry" in command
        assert command[command.index("--version") + 1] in built
    rollout = SERVICES["rollout"]["command"]
    assert isinstance(rollout, list)
    for flag in ("--baseline", "--candidate"):
        assert rollout[rollout.index(flag) + 1] in built
    qos = SERVICES["qos"]["command"]
    assert isinstance(qos, list)
    ladder = set(qos[qos.index("--ladder") + 1].split(","))
    assert ladder <= built[qos[qos.index("--version") + 1]] and len(ladder) > 1


def test_prometheus_scrapes_every_graylane_service_and_grafana_is_provisioned() -> None:
    config = yaml.safe_load((ROOT / "deploy/compose/prometheus.yml").read_text())
    targets = {
        t
        for job in config["scrape_configs"]
        for g in job.get("static_configs", [])
        for t in g["targets"]
    }
    long_running = [
        n for n in GRAYLANE if n not in BUILDERS and n not in ("topics", "qos", "rollout", "load")
    ]
    found_by_dns = {
        f"{name}:{sd['port']}"
        for job in config["scrape_configs"]
        for sd in job.get("dns_sd_configs", [])
        for name in sd["names"]
    }
    assert targets | found_by_dns == {f"{n}:9100" for n in long_running}
    # A target of an optional profile is found by DNS: absent, it is no target (and no
    # worker-down alert); every worker job labels its targets as the alerts select them.
    gpu_only = {f"{n}:9100" for n in long_running if GPU_PROFILE in _profiles(SERVICES[n])}
    assert found_by_dns == gpu_only and gpu_only
    for job in config["scrape_configs"]:
        if "dns_sd_configs" in job:
            assert {"target_label": "component", "replacement": "worker"} in job["relabel_configs"]
    datasource = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml").read_text()
    )
    assert datasource["datasources"][0]["url"] == "http://prometheus:9090"
    provider = yaml.safe_load(
        (ROOT / "deploy/grafana/provisioning/dashboards/graylane.yml").read_text()
    )
    mounts = [str(v) for v in SERVICES["grafana"]["volumes"]]  # type: ignore[attr-defined]
    assert any(m.split(":")[1] == provider["providers"][0]["options"]["path"] for m in mounts)


def test_ordering_waits_on_readiness_not_liveness() -> None:
    """A service that is alive but not ready (consumers not joined, engine not loaded)
    must not let the services after it start."""
    awaited = {
        dep
        for service in SERVICES.values()
        for dep, cond in (service.get("depends_on") or {}).items()
        if isinstance(cond, dict) and cond.get("condition") == "service_healthy"
    }
    graylane_awaited = awaited & set(GRAYLANE)
    assert graylane_awaited
    for name in graylane_awaited:
        test = SERVICES[name]["healthcheck"]["test"]
        assert test[0] == "CMD", f"{name}: the image has no shell for CMD-SHELL"
        assert "/readyz" in " ".join(test) and "/healthz" not in " ".join(test), name


def test_a_small_load_generator_sends_to_the_rolled_out_model() -> None:
    """Without traffic the canary's gates never see a sample and it holds at step 1."""
    load = SERVICES["load"]
    command = load["command"]
    assert isinstance(command, list)
    args = build_parser().parse_args(command[1:])
    assert command[1] == "load" and callable(args.handler)
    rollout = SERVICES["rollout"]["command"]
    assert isinstance(rollout, list)
    assert args.model == rollout[rollout.index("--model") + 1]
    assert 0 < args.rate <= 10
    deps = load["depends_on"]
    assert isinstance(deps, dict)
    assert deps["router"] == {"condition": "service_healthy"}


ENGINE_WORKER = "worker-smollm2-1-0-0"


def test_an_engine_served_version_runs_vllm_on_a_gpu_beside_its_worker() -> None:
    """vLLM on one NVIDIA GPU, healthy once its model is loaded; the worker of smollm2
    1.0.0 starts only then and streams each generation to it by its service name."""
    vllm = SERVICES["vllm"]
    assert str(vllm["image"]).startswith("vllm/vllm-openai:v")
    assert vllm["entrypoint"] == ["vllm", "serve"]
    (device,) = vllm["deploy"]["resources"]["reservations"]["devices"]  # type: ignore[index]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    health = vllm["healthcheck"]
    assert isinstance(health, dict) and health["test"][0] == "CMD"
    assert "http://127.0.0.1:8000/health" in " ".join(health["test"])
    assert int(str(health["start_period"]).rstrip("s")) >= 300  # loading (or fetching) a model
    engine_args = vllm["command"]
    assert isinstance(engine_args, list)
    port = int(_flag(engine_args, "--port"))
    assert _flag(engine_args, "--host") == "0.0.0.0"  # the worker calls it across the network
    mounts = [str(v).split(":") for v in vllm["volumes"]]  # type: ignore[attr-defined]
    assert ["engine-models", "/models"] in mounts

    worker = SERVICES[ENGINE_WORKER]
    command = worker["command"]
    assert isinstance(command, list)
    args = build_parser().parse_args(command[1:])
    assert args.engine == "vllm" and not args.from_registry
    (endpoint,) = args.endpoint
    variant, _, url = endpoint.partition("=")
    assert variant == "fp16" and url == f"http://vllm:{port}"
    assert args.engine_model == _flag(engine_args, "--served-model-name")
    assert args.engine_slots == int(_flag(engine_args, "--max-num-seqs"))
    assert args.engine_version == str(vllm["image"]).rsplit(":v", 1)[1]
    assert worker["depends_on"]["vllm"] == {"condition": "service_healthy"}  # type: ignore[index]
    # the router routes the model and the topics job creates its version topic
    router = build_parser().parse_args(SERVICES["router"]["command"][1:])  # type: ignore[index]
    assert f"{args.model}=1.0.0" in router.model
    topics = build_parser().parse_args(SERVICES["topics"]["command"][1:])  # type: ignore[index]
    assert f"{args.model}={args.version}" in topics.model


def test_a_cpu_machine_runs_the_stack_without_the_gpu_profile() -> None:
    """`docker compose up` starts what has no profile: none of it may need a GPU service."""
    gpu = {n for n, s in SERVICES.items() if GPU_PROFILE in _profiles(s)}
    assert gpu == {"vllm", ENGINE_WORKER}
    for name, service in SERVICES.items():
        assert set(_profiles(service)) <= {GPU_PROFILE}, name
        if name not in gpu:
            assert not set(_depends(service)) & gpu, f"{name} needs the gpu profile"
            assert "deploy" not in service, f"{name} reserves devices"


@pytest.mark.parametrize("name", [n for n in SERVICES if SERVICES[n].get("ports")])
def test_every_published_port_is_on_loopback(name: str) -> None:
    """Regression: compose published Kafka (PLAINTEXT, no login) on 0.0.0.0:9092, open to
    every machine that could reach this one."""
    for port in SERVICES[name]["ports"]:  # type: ignore[attr-defined]
        host, _, _ = str(port).rpartition(":")
        assert host.split(":")[0] == "127.0.0.1", f"{name} publishes {port} beyond loopback"
