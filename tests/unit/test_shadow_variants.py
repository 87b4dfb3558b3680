"""ShadowProductionVariants (issue 45, item 3) through the real boto3 `sagemaker` client over real
HTTP: what the control plane deploys and publishes for a shadow, how DescribeEndpoint shows it, and
promoting it. The Deployer is faked (tests/unit/sagemaker_harness.py); copies reaching a real shadow
container, its failures costing callers nothing and the sampled share run in
tests/integration/test_sagemaker_api.py. `Front.shadow`'s draw is checked here.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from serving.gateway.variants import Front, ShadowRoute, VariantRoute
from tests.unit.sagemaker_harness import Harness, refused


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    running = Harness(tmp_path)
    running.model("m1")
    running.model("m2")
    yield running
    running.stop()


def shadowed(harness: Harness, config: str = "c1", weight: float = 0.5) -> None:
    harness.sm.create_endpoint_config(
        EndpointConfigName=config,
        ProductionVariants=[
            {"VariantName": "Live", "ModelName": "m1", "InstanceType": "ml.m5.large"}
        ],
        ShadowProductionVariants=[
            {
                "VariantName": "Shadow",
                "ModelName": "m2",
                "InstanceType": "ml.m5.large",
                "InitialVariantWeight": weight,
            }
        ],
    )


def test_a_shadow_is_deployed_beside_production_and_gets_its_weights_share_of_copies(
    harness: Harness,
) -> None:
    shadowed(harness)
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    assert sorted(spec.EndpointName for spec in harness.deployer.applied) == [
        "e1@Live@1",
        "e1@Shadow@1",
    ]
    harness.deployer.ready("e1@Live@1", "e1@Shadow@1")
    harness.api.tick()
    assert harness.status("e1") == "InService"
    assert harness.deployer.fronts is not None
    front = harness.deployer.fronts["e1"]
    # never answers a caller
    assert [(v.name, v.endpoint) for v in front.variants] == [("Live", "e1@Live@1")]
    assert front.shadows == (ShadowRoute("Shadow", "e1@Shadow@1", 0.5),)
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert [v["VariantName"] for v in described["ProductionVariants"]] == ["Live"]
    assert [
        (v["VariantName"], v["CurrentWeight"]) for v in described["ShadowProductionVariants"]
    ] == [("Shadow", 0.5)]
    config = harness.sm.describe_endpoint_config(EndpointConfigName="c1")
    assert config["ShadowProductionVariants"][0]["ModelName"] == "m2"


def test_promoting_the_shadow_is_an_update_to_a_config_that_serves_its_model(
    harness: Harness,
) -> None:
    shadowed(harness)
    harness.sm.create_endpoint(EndpointName="e1", EndpointConfigName="c1")
    harness.deployer.ready("e1@Live@1", "e1@Shadow@1")
    harness.api.tick()
    harness.config("promoted", ("Live", "m2"))
    harness.sm.update_endpoint(EndpointName="e1", EndpointConfigName="promoted")
    harness.deployer.ready("e1@Live@2")
    harness.api.tick()
    described = harness.sm.describe_endpoint(EndpointName="e1")
    assert (described["EndpointStatus"], described["EndpointConfigName"]) == (
        "InService",
        "promoted",
    )
    assert "ShadowProductionVariants" not in described
    assert (
        harness.deployer.spec("e1@Live@2")["Containers"][0]["ModelDataUrl"]
        == harness.deployer.spec("e1@Shadow@1")["Containers"][0]["ModelDataUrl"]
    )
    assert harness.deployer.fronts is not None and harness.deployer.fronts["e1"].shadows == ()
    harness.clock.advance(11)
    harness.api.tick()
    assert {"e1@Live@1", "e1@Shadow@1"} <= set(harness.deployer.deleted)


def test_shadow_configs_sagemaker_would_refuse_are_refused_naming_the_field(
    harness: Harness,
) -> None:
    variant = {"VariantName": "Live", "ModelName": "m1", "InstanceType": "ml.m5.large"}
    shadow = {"VariantName": "Shadow", "ModelName": "m2", "InstanceType": "ml.m5.large"}
    create = lambda **fields: harness.sm.create_endpoint_config(EndpointConfigName="c", **fields)  # noqa: E731
    refused(
        lambda: create(
            ProductionVariants=[variant, {**variant, "VariantName": "Other"}],
            ShadowProductionVariants=[shadow],
        ),
        "ValidationException",
        "give one production variant",
    )
    refused(
        lambda: create(
            ProductionVariants=[variant],
            ShadowProductionVariants=[shadow, {**shadow, "VariantName": "S2"}],
        ),
        "ValidationException",
        "ShadowProductionVariants",
    )
    refused(
        lambda: create(
            ProductionVariants=[variant],
            ShadowProductionVariants=[{**shadow, "VariantName": "Live"}],
        ),
        "ValidationException",
        "VariantName Live is given more than once",
    )
    refused(
        lambda: create(
            ProductionVariants=[variant], ShadowProductionVariants=[{**shadow, "ModelName": "nope"}]
        ),
        "ValidationException",
        "nope",
    )


def test_a_shadow_samples_its_share_of_invocations() -> None:
    front = Front(
        "e1",
        (VariantRoute("Live", "e1@Live@1", 1.0),),
        (ShadowRoute("Shadow", "e1@Shadow@1", 0.3),),
    )
    draws = random.Random(11)
    copied = sum(front.shadow(draws.random) is not None for _ in range(10_000))
    assert 2850 < copied < 3150
    assert Front("e2", (VariantRoute("Live", "e2@Live@1", 1.0),)).shadow() is None


def test_copies_past_the_bound_are_dropped_and_every_outcome_is_counted() -> None:
    import asyncio

    from serving.gateway.after_answer import AfterAnswer
    from serving.gateway.shadows import MAX_IN_FLIGHT, SHADOW_COPIES, ShadowCopies

    def count(outcome: str) -> float:
        return SHADOW_COPIES.labels("bound", "Shadow", outcome)._value.get()

    async def scenario() -> None:
        copies, release = ShadowCopies(AfterAnswer()), asyncio.Event()

        async def slow() -> bool:
            await release.wait()
            return True

        async def failing() -> bool:
            raise RuntimeError("a bug in a copy: logged, counted, never the caller's")

        before = {outcome: count(outcome) for outcome in ("answered", "failed", "dropped")}
        for _ in range(MAX_IN_FLIGHT + 3):
            copies.start("bound", "Shadow", slow)
        assert copies.in_flight == MAX_IN_FLIGHT
        release.set()
        await asyncio.sleep(0.05)
        copies.start("bound", "Shadow", failing)
        await asyncio.sleep(0.05)
        assert copies.in_flight == 0
        assert count("answered") - before["answered"] == MAX_IN_FLIGHT
        assert (count("dropped") - before["dropped"], count("failed") - before["failed"]) == (3, 1)
        await copies.after.close()

    asyncio.run(scenario())
