"""A real Prometheus scrapes a running local stack (router, two workers, the policy engine)
and answers PromQL for a version's p99 end-to-end latency and its routing weight."""

from __future__ import annotations

import socket
import urllib.request
from pathlib import Path

import pytest

from graylane.deploy.prometheus.server import PrometheusServer, Sample, prometheus_binary
from graylane.kafka.seam import KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.policy_engine.app import PolicyConfig, prepare_topics
from graylane.rollouts.spec import RolloutSpec, Step
from graylane.settings import Settings
from tests.integration.test_policy_engine import send_command, start_command
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.stack import running_stack
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
P99 = (
    "histogram_quantile(0.99, sum by (version, le) "
    f'(rate(graylane_e2e_latency_seconds_bucket{{model="{MODEL}"}}[30s])))'
)
WEIGHT = f'graylane_router_weight_ratio{{model="{MODEL}",version="v2"}}'


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _http(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as res:
            return int(res.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    return {
        "v1": write_demo_gpt(root / "v1.onnx", "tiny", seed=1),
        "v2": write_demo_gpt(root / "v2.onnx", "tiny", seed=2),
    }


async def test_prometheus_answers_p99_and_weight_per_version(
    settings: Settings,
    factory: KafkaFactory,
    models: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    prometheus_binary()  # installs Debian's prometheus when missing
    policy_port = _free_port()
    monkeypatch.setenv("GRAYLANE_METRICS_PORT", str(policy_port))
    await prepare_topics(settings, PolicyConfig(models=(MODEL,)))
    log = tmp_path / "policy.log"
    spec = RolloutSpec(
        rollout_id="prom-1",
        model=MODEL,
        baseline="v1",
        candidate="v2",
        # Stays on its first step (20 %) for the whole test.
        steps=(Step(20.0, 1_000_000, 3600.0), Step(100.0, 0, 0.0)),
    )
    async with (
        running_stack(factory, model=MODEL, versions=models, stable="v1", max_seq_len=64) as stack,
        RoutingWatch(factory, MODEL) as watch,
    ):
        router_port = stack.router.observability.port
        worker_ports = [w.observability.port for w in stack.workers.values()]
        assert router_port and all(worker_ports), "metrics are on by default"
        assert _http(router_port, "/healthz") == 200
        await wait_until(lambda: _http(router_port, "/readyz") == 200, timeout=30)
        with policy_engine(settings, log, MODEL):
            await wait_ready(log)
            await wait_until(lambda: _http(policy_port, "/readyz") == 200, timeout=60)
            jobs = {
                "graylane-router": [f"127.0.0.1:{router_port}"],
                "graylane-worker": [f"127.0.0.1:{p}" for p in worker_ports],
                "graylane-policy-engine": [f"127.0.0.1:{policy_port}"],
            }
            with PrometheusServer.start(jobs, tmp_path / "prometheus") as prom:
                await send_command(factory, start_command(spec))
                await watch.until(lambda t: watch.weight(t, "v2") == 20.0, timeout_s=60)
                async with steady_load(factory, MODEL, rps=30.0):

                    def answered() -> bool:
                        p99 = {s.labels.get("version"): s.value for s in prom.query(P99)}
                        weight = prom.query(WEIGHT)
                        return (
                            p99.get("v1", 0.0) > 0.0
                            and p99.get("v2", 0.0) > 0.0
                            and [s.value for s in weight] == [0.2]
                        )

                    await wait_until(answered, timeout=90, poll_s=1.0, what="PromQL answers")
                p99_samples = prom.query(P99)
                weight_samples = prom.query(WEIGHT)
                up = prom.query("up")
                phase = prom.query(f'graylane_rollout_phase{{model="{MODEL}",version="v2"}} == 1')
                build = prom.query("graylane_build_info")
    assert {s.labels["job"] for s in up if s.value == 1.0} == set(jobs), _show(up)
    assert all(0.0 < s.value < 30.0 for s in p99_samples), _show(p99_samples)
    assert [s.value for s in weight_samples] == [0.2]
    assert [s.labels["phase"] for s in phase] == ["progressing"], _show(phase)
    assert {s.labels["service"] for s in build} == {"router", "worker", "policy-engine"}
    with capsys.disabled():
        print(f"\nPromQL {P99}\n  -> {_show(p99_samples)}")
        print(f"PromQL {WEIGHT}\n  -> {_show(weight_samples)}")


def _show(samples: list[Sample]) -> str:
    return "; ".join(
        "{" + ",".join(f"{k}={v}" for k, v in sorted(s.labels.items())) + f"}} {s.value:.4g}"
        for s in samples
    )
