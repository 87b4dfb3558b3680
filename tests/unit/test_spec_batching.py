"""The spec's Batching field, its SERVING_* equivalents and the model thread count: errors name the
field."""

from __future__ import annotations

from typing import Any

import pytest

from serving.config.spec import DEFAULT_MAX_CONCURRENCY, SpecError, parse_spec
from serving.control.runtime_env import replica_environment
from serving.runtimes.concurrency import BatchSettings, batch_settings, model_threads


def spec(**fields: Any):
    container = {"ContainerHostname": "english", "Image": "pytorch", **fields}
    return parse_spec({"EndpointName": "mce-demo", "Containers": [container]}).Containers[0]


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"Batching": {"MaxBatchSize": 0}}, r"Containers\[0\]\.Batching\.MaxBatchSize"),
        ({"Batching": {"MaxDelayMs": 5}}, r"Containers\[0\]\.Batching\.MaxBatchSize"),
        (
            {"Batching": {"MaxBatchSize": 8, "MaxDelayMs": -1}},
            r"Containers\[0\]\.Batching\.MaxDelayMs",
        ),
        (
            {"Batching": {"MaxBatchSize": 8, "PreferredBatchSizes": [0]}},
            r"Batching\.PreferredBatchSizes",
        ),
        (
            {"Batching": {"MaxBatchSize": 8, "PreferredBatchSizes": [4, 16]}},
            r"PreferredBatchSizes \[16\] exceed",
        ),
        ({"Batching": {"MaxBatchSize": 8, "Timeout": 1}}, r"Batching\.Timeout"),
        (
            {"Batching": {"MaxBatchSize": 8}, "Environment": {"SERVING_MAX_BATCH_SIZE": "4"}},
            r"Batching and Environment SERVING_MAX_BATCH_SIZE both set",
        ),
        (
            {"Environment": {"SERVING_MAX_BATCH_SIZE": "many"}},
            r"Environment.*SERVING_MAX_BATCH_SIZE must be a whole",
        ),
        (
            {"Environment": {"SERVING_MAX_BATCH_DELAY_MS": "5"}},
            r"SERVING_MAX_BATCH_DELAY_MS needs SERVING_MAX_BATCH_SIZE",
        ),
        (
            {"Environment": {"SERVING_MAX_BATCH_SIZE": "8", "SERVING_MAX_BATCH_DELAY_MS": "soon"}},
            r"SERVING_MAX_BATCH_DELAY_MS must be milliseconds",
        ),
        (
            {
                "Environment": {
                    "SERVING_MAX_BATCH_SIZE": "8",
                    "SERVING_PREFERRED_BATCH_SIZES": "4,9",
                }
            },
            r"SERVING_PREFERRED_BATCH_SIZES \[9\] exceed SERVING_MAX_BATCH_SIZE 8",
        ),
        (
            {"Environment": {"SERVING_MODEL_THREADS": "0"}},
            r"SERVING_MODEL_THREADS must be a whole number",
        ),
        (
            {"Environment": {"SERVING_INLINE_BUDGET_MS": "500"}},
            r"SERVING_INLINE_BUDGET_MS must be milliseconds",
        ),
    ],
)
def test_batching_and_thread_errors_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(SpecError, match=message):
        spec(**fields)


def test_batching_of_a_multimodel_container_is_refused(tmp_path) -> None:
    with pytest.raises(
        SpecError, match=r"Containers\[0\].*Batching applies to SingleModel containers only"
    ):
        spec(Mode="MultiModel", ModelDataUrl=str(tmp_path), Batching={"MaxBatchSize": 8})


def test_the_batching_field_reaches_the_container_as_its_variables() -> None:
    container = spec(
        Batching={"MaxBatchSize": 32, "MaxDelayMs": 2.5, "PreferredBatchSizes": [16, 8]}
    )
    environment = replica_environment(container)
    assert environment["SERVING_MAX_BATCH_SIZE"] == "32"
    assert environment["SERVING_MAX_BATCH_DELAY_MS"] == "2.5"
    assert batch_settings(environment) == BatchSettings(32, 0.0025, (8, 16))


def test_the_variables_alone_batch_too_and_a_size_of_one_is_off() -> None:
    assert batch_settings({"SERVING_MAX_BATCH_SIZE": "4"}) == BatchSettings(4, 0.0, ())
    assert (
        batch_settings({"SERVING_MAX_BATCH_SIZE": "1", "SERVING_MAX_BATCH_DELAY_MS": "3"}) is None
    )
    assert batch_settings({}) is None


@pytest.mark.parametrize(
    ("image", "environment", "scripted", "threads"),
    [
        ("pytorch", {"SERVING_CPUS": "2.5"}, False, 3),
        ("onnx", {"SERVING_CPUS": "0.1"}, False, 1),
        ("tensorflow", {"SERVING_CPUS": "4"}, False, 4),
        ("xgboost", {"SERVING_CPUS": "2"}, False, 2),
        ("sklearn", {"SERVING_CPUS": "8"}, False, 1),  # holds the GIL: threads would only queue
        ("python", {"SERVING_CPUS": "8"}, False, 1),
        ("pytorch", {"SERVING_CPUS": "8"}, True, 1),  # a user's hooks are not assumed thread-safe
        ("python", {"SERVING_CPUS": "1", "SERVING_MODEL_THREADS": "6"}, True, 6),
    ],
)
def test_model_threads_follow_the_stack_and_the_cpu_share(
    image, environment, scripted, threads
) -> None:
    assert model_threads(image, environment, scripted=scripted) == threads


def test_the_default_in_flight_bound_keeps_threads_and_a_batch_busy() -> None:
    assert spec().max_concurrency == DEFAULT_MAX_CONCURRENCY
    big = spec(Resources={"Cpus": 200}, Batching={"MaxBatchSize": 64})
    assert big.model_threads == 200
    assert big.max_concurrency == 264
    assert (
        spec(Resources={"Cpus": 200}, Environment={"SERVING_MAX_CONCURRENCY": "10"}).max_concurrency
        == 10
    )
