"""Least privilege with every service running: a canary promoted on a secured broker.

Router, two workers, the policy engine (with its lease, as ``graylane policy``), the
control plane and its audit sink each log in as their own role and hold only the ACLs
``graylane acls --apply`` grants. A rollout started through the control plane (its START
check Describes the candidate's worker group) is promoted by the policy engine (its
liveness probe Describes the worker groups); the API gateway, under its own login, serves
a completion and lists the model; then every login is refused what its role must not do.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from aiokafka.errors import KafkaError
from grpc import aio

from graylane.acls import AclScope, KafkaRole
from graylane.engine.onnxruntime import OnnxRuntimeEngine
from graylane.engine_worker.config import WorkerConfig
from graylane.engine_worker.service import Worker
from graylane.kafka.admin import ensure_topics
from graylane.kafka.reading import read_to_end
from graylane.kafka.seam import ConsumerOptions, KafkaFactory
from graylane.models.demo_gpt import write_demo_gpt
from graylane.services.controlplane.auth import TokenTable, parse_tokens
from graylane.services.controlplane.service import ControlPlaneServer, ServerConfig
from graylane.services.router.service import Router, RouterConfig
from graylane.v1 import controlplane_pb2_grpc, rollout_pb2
from tests.support.brokers import SecuredBroker, grant_roles, secured_broker
from tests.support.gateway import running_gateway
from tests.support.policy import RoutingWatch, policy_engine, steady_load, wait_ready
from tests.support.releases import BASE, CANDIDATE, register
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.kafka, pytest.mark.slow]

MODEL = "gpt"
CLIENT, OTHER_CLIENT = "app1", "app2"
OPS = (("authorization", "Bearer ops-token-0123456"),)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredBroker]:
    with secured_broker(tmp_path_factory.mktemp("secured-kafka")) as broker:
        yield broker


def _worker(factory: KafkaFactory, version: str, path: Path) -> Worker:
    engine = OnnxRuntimeEngine.load(path, "fp32", name=MODEL, intra_op_threads=1)
    config = WorkerConfig(
        model=MODEL,
        version=version,
        initial_variant="fp32",
        max_seq_len=64,
        buckets=(16, 32, 64),
        max_batch_size=8,
        worker_id=f"secured-{version}",
    )
    return Worker(factory, config, {"fp32": engine})


async def _write_refused(factory: KafkaFactory, topic: str) -> bool:
    """Whether this login's attempt to write ``topic`` is refused by the authorizer."""
    producer = factory.producer(client_suffix="forge")
    await producer.start()
    try:
        await asyncio.wait_for(producer.send_and_wait(topic, b"forged", key=MODEL.encode()), 30)
    except KafkaError as exc:
        return "uthoriz" in type(exc).__name__ + str(exc)
    finally:
        await producer.stop()
    return False


async def _read_refused(factory: KafkaFactory, topic: str) -> bool:
    """Whether this login's attempt to read ``topic`` (no consumer group) is refused."""
    consumer = factory.consumer(
        topic, options=ConsumerOptions(group_id=None), client_suffix="snoop"
    )
    try:
        await consumer.start()
        await asyncio.wait_for(consumer.getmany(timeout_ms=3000), 30)
    except KafkaError as exc:
        return "uthoriz" in type(exc).__name__ + str(exc)
    finally:
        await consumer.stop()
    return False


async def test_every_service_under_its_own_login_promotes_a_canary_and_nothing_more(
    secured: SecuredBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the policy engine had no ACL for its lease topic and neither it nor the
    control plane might Describe worker groups, so under ACLs the policy engine never
    started and a START through the control plane was refused."""
    prefix = f"a{uuid.uuid4().hex[:8]}"

    def login(role: KafkaRole) -> KafkaFactory:
        return KafkaFactory(secured.settings(role.value, prefix, tmp_path))

    admin = KafkaFactory(secured.settings("admin", prefix, tmp_path))
    layout = admin.layout
    specs = layout.shared_specs() + layout.model_specs(MODEL, [BASE, CANDIDATE])
    await ensure_topics(admin, [*specs, layout.reply_spec(CLIENT), layout.reply_spec(OTHER_CLIENT)])
    await grant_roles(admin, AclScope(models=(MODEL,), clients=(CLIENT,)))
    register(admin.settings, MODEL, "secured")

    paths = {
        v: write_demo_gpt(tmp_path / f"{v}.onnx", "tiny", seed=i)
        for i, v in enumerate((BASE, CANDIDATE), 1)
    }
    router = Router(login(KafkaRole.ROUTER), RouterConfig(stable_versions={MODEL: BASE}))
    workers = [_worker(login(KafkaRole.WORKER), v, p) for v, p in paths.items()]
    stop = asyncio.Event()
    tasks = [asyncio.create_task(s.run(stop)) for s in (router, *workers)]
    server = ControlPlaneServer(
        ServerConfig(
            host="127.0.0.1",
            port=0,
            tokens=TokenTable(parse_tokens("ops-token-0123456:operator:alice")),
            outbox_interval_s=0.5,
        ),
        login(KafkaRole.CONTROL_PLANE),
    )
    # The policy engine is a `graylane policy` process: its login comes from the environment.
    policy = secured.settings(KafkaRole.POLICY_ENGINE.value, prefix, tmp_path)
    monkeypatch.setenv("GRAYLANE_SECURITY_PROTOCOL", policy.security.protocol.value)
    monkeypatch.setenv("GRAYLANE_SASL_MECHANISM", "PLAIN")
    monkeypatch.setenv("GRAYLANE_SASL_USERNAME", KafkaRole.POLICY_ENGINE.value)
    monkeypatch.setenv("GRAYLANE_SASL_PASSWORD", secured.passwords[KafkaRole.POLICY_ENGINE.value])
    log = tmp_path / "policy.log"
    producer = login(KafkaRole.PRODUCER)
    try:
        services = {"router": router, **{f"worker {w.config.version}": w for w in workers}}

        def started() -> bool:
            return all(s.ready.is_set() for s in services.values()) or any(t.done() for t in tasks)

        try:
            await wait_until(started, timeout=120)
        except TimeoutError:
            late = [n for n, s in services.items() if not s.ready.is_set()]
            raise AssertionError(f"not ready within 120 s: {late}") from None
        assert not any(t.done() for t in tasks), [t.exception() for t in tasks if t.done()]
        await server.start()
        await asyncio.wait_for(server.sink.ready.wait(), 30)
        channel = aio.insecure_channel(f"127.0.0.1:{server.port}")
        rollouts = controlplane_pb2_grpc.RolloutsStub(channel)
        with policy_engine(policy, log, MODEL) as engine:
            await wait_ready(log)  # it took the lease and restored its state
            async with (
                RoutingWatch(admin, MODEL) as routing,
                steady_load(producer, MODEL, client_id=CLIENT),
            ):
                steps = [
                    rollout_pb2.RolloutStep(weight_percent=w, min_samples=10, min_dwell_s=1.0)
                    for w in (10, 100)
                ]
                spec = rollout_pb2.RolloutSpec(
                    model=MODEL, candidate_version=CANDIDATE, steps=steps
                )
                state = await rollouts.Start(spec, metadata=OPS)  # the START check passed
                _, final = await routing.until(lambda t: t.stable_version == CANDIDATE, 90)
            assert routing.weight(final, CANDIDATE) == 100.0

            def promoted() -> bool:
                got = server.store.get_rollout(state.rollout_id)
                return got is not None and got.state.phase == rollout_pb2.PROMOTED

            await wait_until(promoted, timeout=30, what="the control plane stored the promotion")
            audited = server.store.query_audit(rollout_id=state.rollout_id)
            assert audited, "the audit sink stored no decision of the rollout"
            assert engine.poll() is None, log.read_text(errors="replace")[-3000:]
        await channel.close()

        # The API gateway under its own login: a call through it is served (by the promoted
        # version), and it lists the model from the topics its role may see.
        async with (
            running_gateway(login(KafkaRole.GATEWAY), keys=None, replica="secured") as gateway,
            openai.AsyncOpenAI(
                base_url=f"{gateway.url}/v1", api_key="open-gateway", max_retries=0
            ) as client,
        ):
            answer = await client.completions.create(
                model=MODEL, prompt="hello", max_tokens=2, temperature=0
            )
            listed = await client.models.list()
        assert answer.system_fingerprint == f"graylane:{CANDIDATE}"
        assert [m.id for m in listed.data] == [MODEL]

        # Each login is refused what its role must not do; nothing forged lands.
        guarded = [
            layout.routing(),
            layout.precision(),
            layout.commands(),
            layout.reply(OTHER_CLIENT),
        ]
        before = {t: len(await read_to_end(admin, t)) for t in guarded}
        refusals = {
            "worker writes control.routing": (KafkaRole.WORKER, layout.routing()),
            "router writes control.precision": (KafkaRole.ROUTER, layout.precision()),
            "control plane writes control.routing": (KafkaRole.CONTROL_PLANE, layout.routing()),
            "policy engine writes control.commands": (KafkaRole.POLICY_ENGINE, layout.commands()),
            "producer writes control.routing": (KafkaRole.PRODUCER, layout.routing()),
            "gateway writes control.routing": (KafkaRole.GATEWAY, layout.routing()),
            "gateway writes a version topic": (
                KafkaRole.GATEWAY,
                layout.version_requests(MODEL, BASE),
            ),
        }
        for what, (role, topic) in refusals.items():
            assert await _write_refused(login(role), topic), what
        assert await _read_refused(producer, layout.reply(OTHER_CLIENT)), "producer reads app2"
        gateway_login = login(KafkaRole.GATEWAY)
        assert await _read_refused(gateway_login, layout.reply(OTHER_CLIENT)), "gateway reads"
        assert await _read_refused(login(KafkaRole.WORKER), layout.commands()), "worker reads"
        assert {t: len(await read_to_end(admin, t)) for t in guarded} == before
        assert all(not t.done() for t in tasks), "a service ended"
    finally:
        stop.set()
        await server.stop(0)
        await asyncio.gather(*tasks, return_exceptions=True)
