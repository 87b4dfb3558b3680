"""serving.config.spec: every rejection names the field at fault and says why."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from serving.config.spec import (
    DEFAULT_MAX_CONCURRENCY,
    MAX_CONTAINERS,
    ContainerMode,
    ExecutionMode,
    SpecError,
    load_spec,
    parse_spec,
)


def container(hostname: str = "english", **fields: Any) -> dict[str, Any]:
    return {"ContainerHostname": hostname, "Image": "python", **fields}


def endpoint(*containers: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"EndpointName": "mce-demo", "Containers": list(containers) or [container()], **fields}


@pytest.fixture
def spec_dir(tmp_path: Path) -> Path:
    """A spec folder with a model directory, an archive and a plain file under models/."""
    (tmp_path / "models" / "english" / "1").mkdir(parents=True)
    (tmp_path / "models" / "model.tar.gz").write_bytes(b"not read by the spec")
    (tmp_path / "models" / "weights.bin").write_bytes(b"\0")
    return tmp_path


def write_yaml(folder: Path, document: Any, name: str = "endpoint.yaml") -> Path:
    path = folder / name
    path.write_text(yaml.safe_dump(document, sort_keys=False))
    return path


# --- accepted specs -------------------------------------------------------------------


def test_yaml_direct_spec_resolves_model_paths_against_its_folder(
    spec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")  # relative paths must not depend on the working directory
    path = spec_dir / "endpoint.yaml"
    path.write_text(
        """\
EndpointName: mce-demo
InferenceExecutionConfig: {Mode: Direct}
Containers:
  - ContainerHostname: english
    Image: sklearn
    ModelDataUrl: models/english/1
    Environment: {SERVING_LOG_LEVEL: info}
    Resources: {Cpus: 0.5, MemoryMb: 1024, Gpus: 0}
  - ContainerHostname: labels
    Image: python
    ModelDataUrl: file://models/model.tar.gz
"""
    )
    spec = load_spec(path)
    assert spec.EndpointName == "mce-demo"
    assert spec.mode is ExecutionMode.DIRECT
    english, labels = spec.Containers
    assert english.ModelDataUrl == str((spec_dir / "models" / "english" / "1").resolve())
    assert labels.ModelDataUrl == str((spec_dir / "models" / "model.tar.gz").resolve())
    assert english.Mode is ContainerMode.SINGLE
    assert english.Environment == {"SERVING_LOG_LEVEL": "info"}
    assert english.Resources.Cpus == 0.5 and english.Resources.MemoryMb == 1024
    assert english.replicas == labels.replicas == 1
    assert spec.container("labels") is labels
    assert spec.container("nope") is None


def test_json_serial_spec(spec_dir: Path) -> None:
    document = endpoint(
        container(
            "preprocess", Image="sklearn", ModelDataUrl=str(spec_dir / "models" / "english" / "1")
        ),
        container("labels"),
        InferenceExecutionConfig={"Mode": "Serial"},
    )
    path = spec_dir / "endpoint.json"
    path.write_text(json.dumps(document))
    spec = load_spec(path)
    assert spec.mode is ExecutionMode.SERIAL
    assert [c.ContainerHostname for c in spec.Containers] == ["preprocess", "labels"]
    assert spec.Containers[1].ModelDataUrl is None


def test_defaults_of_a_minimal_spec() -> None:
    spec = parse_spec(endpoint())
    assert spec.mode is ExecutionMode.DIRECT
    only = spec.Containers[0]
    assert only.Mode is ContainerMode.SINGLE and only.Environment == {} and only.AutoScaling is None
    assert only.Resources.Cpus > 0 and only.Resources.Gpus == 0
    assert spec.AccessControl is None


def test_fifteen_containers_and_a_63_character_name_are_accepted() -> None:
    name = "a" * 63
    spec = parse_spec(
        endpoint(*(container(f"c{i}") for i in range(MAX_CONTAINERS)), EndpointName=name)
    )
    assert len(spec.Containers) == MAX_CONTAINERS
    assert spec.EndpointName == name


@pytest.mark.parametrize(
    ("environment", "limit"), [({}, DEFAULT_MAX_CONCURRENCY), ({"SERVING_MAX_CONCURRENCY": "8"}, 8)]
)
def test_max_concurrency_comes_from_the_environment(
    environment: dict[str, str], limit: int
) -> None:
    assert (
        parse_spec(endpoint(container(Environment=environment))).Containers[0].max_concurrency
        == limit
    )


def test_parse_spec_resolves_relative_paths_against_base_dir(spec_dir: Path) -> None:
    spec = parse_spec(endpoint(container(ModelDataUrl="models/english/1")), base_dir=spec_dir)
    assert (
        Path(spec.Containers[0].ModelDataUrl) == (spec_dir / "models" / "english" / "1").resolve()
    )


# --- rejected specs -------------------------------------------------------------------
# (id, document, field path, reason fragment); each document is written to a YAML file
# in a folder holding models/english/1, models/model.tar.gz and models/weights.bin.
REJECTED = [
    ("no containers", endpoint(Containers=[]), "Containers", "at least 1"),
    (
        "16 containers",
        endpoint(*(container(f"c{i}") for i in range(16))),
        "Containers",
        "at most 15 containers",
    ),
    (
        "duplicate hostnames",
        endpoint(container("a"), container("b"), container("a")),
        "Containers[2].ContainerHostname",
        "duplicates Containers[0]",
    ),
    (
        "hostname with underscore",
        endpoint(container("bad_name")),
        "Containers[0].ContainerHostname",
        "1-63 letters",
    ),
    (
        "hostname starting with hyphen",
        endpoint(container("-abc")),
        "Containers[0].ContainerHostname",
        "1-63 letters",
    ),
    (
        "hostname ending with hyphen",
        endpoint(container("abc-")),
        "Containers[0].ContainerHostname",
        "1-63 letters",
    ),
    (
        "hostname of 64 characters",
        endpoint(container("a" * 64)),
        "Containers[0].ContainerHostname",
        "63",
    ),
    (
        "hostname of 82 characters made of hyphens",
        endpoint(container("a" + "-" * 80 + "b")),
        "Containers[0].ContainerHostname",
        "63",
    ),
    ("empty hostname", endpoint(container("")), "Containers[0].ContainerHostname", "1-63 letters"),
    (
        "endpoint name with a space",
        endpoint(EndpointName="mce demo"),
        "EndpointName",
        "1-63 letters",
    ),
    ("endpoint name of 64 characters", endpoint(EndpointName="e" * 64), "EndpointName", "63"),
    (
        "endpoint name of 82 characters made of hyphens",
        endpoint(EndpointName="e" + "-" * 80 + "e"),
        "EndpointName",
        "63",
    ),
    (
        "reserved endpoint name",
        endpoint(EndpointName="serving-gateway"),
        "EndpointName",
        "reserved",
    ),
    ("missing endpoint name", {"Containers": [container()]}, "EndpointName", "required"),
    ("unknown top-level field", endpoint(Bogus=1), "Bogus", "unknown field"),
    (
        "unknown container field",
        endpoint(container(Bogus="x")),
        "Containers[0].Bogus",
        "unknown field",
    ),
    (
        "unknown field nested in a container",
        endpoint(container("a"), container("b", Resources={"Cpus": 1, "Bogus": 2})),
        "Containers[1].Resources.Bogus",
        "unknown field",
    ),
    (
        "unknown Image",
        endpoint(container(Image="caffe")),
        "Containers[0].Image",
        "unknown Image 'caffe'",
    ),
    (
        "missing Image",
        endpoint({"ContainerHostname": "english"}),
        "Containers[0].Image",
        "required",
    ),
    (
        "missing model directory",
        endpoint(container(ModelDataUrl="models/french/1")),
        "Containers[0].ModelDataUrl",
        "does not exist",
    ),
    (
        "missing file:// model",
        endpoint(container(ModelDataUrl="file://models/french.tar.gz")),
        "Containers[0].ModelDataUrl",
        "does not exist",
    ),
    (
        "plain file that is not an archive",
        endpoint(container(ModelDataUrl="models/weights.bin")),
        "Containers[0].ModelDataUrl",
        "must be a directory or a .tar.gz archive",
    ),
    (
        "an s3 prefix for a SingleModel container",
        endpoint(container(ModelDataUrl="s3://bucket/models/")),
        "Containers[0]",
        "a SingleModel container's s3:// model data is one .tar.gz object",
    ),
    (
        "MultiModel prefix that is an archive",
        endpoint(container(Mode="MultiModel", ModelDataUrl="models/model.tar.gz")),
        "Containers[0]",
        "must be a directory or s3:// prefix",
    ),
    (
        "MultiModel without a prefix",
        endpoint(container(Mode="MultiModel", ModelDataUrl=None)),
        "Containers[0]",
        "ModelDataUrl is required for a MultiModel container",
    ),
    (
        "s3 prefix without a bucket",
        endpoint(container(Mode="MultiModel", ModelDataUrl="s3:///models")),
        "Containers[0]",
        "names no bucket",
    ),
    (
        "MultiModelConfig on a SingleModel container",
        endpoint(container(MultiModelConfig={"ModelCacheSetting": "Disabled"})),
        "Containers[0]",
        "MultiModelConfig applies to MultiModel containers only",
    ),
    (
        "bad ModelCacheSetting",
        endpoint(
            container(
                Mode="MultiModel",
                ModelDataUrl="models",
                MultiModelConfig={"ModelCacheSetting": "Off"},
            )
        ),
        "Containers[0].MultiModelConfig.ModelCacheSetting",
        "'Enabled' or 'Disabled'",
    ),
    (
        "MultiModel in a Serial endpoint",
        endpoint(
            container(Mode="MultiModel", ModelDataUrl="models"),
            container("german"),
            InferenceExecutionConfig={"Mode": "Serial"},
        ),
        "(spec)",
        "a Serial endpoint serves SingleModel containers only",
    ),
    (
        "SERVING_MAX_MODELS not a count",
        endpoint(container(Environment={"SERVING_MAX_MODELS": "0"})),
        "Containers[0].Environment",
        "SERVING_MAX_MODELS must be a whole number",
    ),
    (
        "MinCapacity above MaxCapacity",
        endpoint(container(AutoScaling={"MinCapacity": 3, "MaxCapacity": 2})),
        "Containers[0].AutoScaling",
        "MinCapacity (3) must not exceed MaxCapacity (2)",
    ),
    (
        "AutoScaling range without a policy",
        endpoint(container(AutoScaling={"MinCapacity": 1, "MaxCapacity": 2})),
        "Containers[0].AutoScaling",
        "MinCapacity < MaxCapacity needs a TargetTrackingScalingPolicyConfiguration",
    ),
    (
        "two metric specifications",
        endpoint(
            container(
                AutoScaling={
                    "MaxCapacity": 2,
                    "TargetTrackingScalingPolicyConfiguration": {
                        "TargetValue": 5,
                        "PredefinedMetricSpecification": {},
                        "CustomizedMetricSpecification": {"MetricName": "q"},
                    },
                }
            )
        ),
        "Containers[0].AutoScaling.TargetTrackingScalingPolicyConfiguration",
        "not both",
    ),
    (
        "two policies on one metric",
        endpoint(
            container(
                AutoScaling={
                    "MaxCapacity": 2,
                    "TargetTrackingScalingPolicyConfiguration": [
                        {"TargetValue": 5},
                        {"TargetValue": 9},
                    ],
                }
            )
        ),
        "Containers[0].AutoScaling",
        "one target-tracking policy per metric",
    ),
    (
        "endpoint and container scaling",
        endpoint(
            container(AutoScaling={"MinCapacity": 2, "MaxCapacity": 2}),
            AutoScaling={"MinCapacity": 1, "MaxCapacity": 1},
        ),
        "(spec)",
        "use one level",
    ),
    (
        "zero TargetValue",
        endpoint(
            container(AutoScaling={"TargetTrackingScalingPolicyConfiguration": {"TargetValue": 0}})
        ),
        "Containers[0].AutoScaling.TargetTrackingScalingPolicyConfiguration.TargetValue",
        "greater than 0",
    ),
    (
        "bad container Mode",
        endpoint(container(Mode="Dual")),
        "Containers[0].Mode",
        "'SingleModel' or 'MultiModel'",
    ),
    (
        "bad execution Mode",
        endpoint(InferenceExecutionConfig={"Mode": "Parallel"}),
        "InferenceExecutionConfig.Mode",
        "'Direct' or 'Serial'",
    ),
    (
        "AccessControl without its file",
        endpoint(AccessControl={"IdentitiesFile": "identities.yaml"}),
        "AccessControl.IdentitiesFile",
        "identities file 'identities.yaml' does not exist",
    ),
    (
        "AccessControl with an unknown field",
        endpoint(AccessControl={"Identities": []}),
        "AccessControl.Identities",
        "unknown field",
    ),
    (
        "zero Cpus",
        endpoint(container(Resources={"Cpus": 0})),
        "Containers[0].Resources.Cpus",
        "greater than 0",
    ),
    (
        "Environment key with a hyphen",
        endpoint(container(Environment={"BAD-KEY": "x"})),
        "Containers[0].Environment.BAD-KEY",
        "pattern",
    ),
    (
        "Environment value not a string",
        endpoint(container(Environment={"SERVING_X": 5})),
        "Containers[0].Environment.SERVING_X",
        "string",
    ),
    (
        "zero max concurrency",
        endpoint(container(Environment={"SERVING_MAX_CONCURRENCY": "0"})),
        "Containers[0].Environment",
        "SERVING_MAX_CONCURRENCY must be a whole number of at least 1, got '0'",
    ),
    (
        "fractional max concurrency",
        endpoint(container(Environment={"SERVING_MAX_CONCURRENCY": "2.5"})),
        "Containers[0].Environment",
        "whole number",
    ),
    ("spec that is a list", [endpoint()], "(spec)", "must be a mapping"),
    ("empty spec file", None, "(spec)", "must be a mapping"),
]


def _names(path: str, field: str) -> bool:
    """Whether an error line's path is `field` or lies inside it."""
    return path == field or path.startswith(field + ".")


@pytest.mark.parametrize(
    ("document", "field", "reason"),
    [case[1:] for case in REJECTED],
    ids=[case[0] for case in REJECTED],
)
def test_rejected_spec_names_field_and_reason(
    spec_dir: Path, document: Any, field: str, reason: str
) -> None:
    with pytest.raises(SpecError) as caught:
        load_spec(write_yaml(spec_dir, document))
    message = str(caught.value)
    # A cross-field check reports at "(spec)" and names the field in its text.
    line = next(
        (
            line
            for line in message.splitlines()
            if _names(line.split(": ", 1)[0], field) or line.startswith(f"(spec): {field}")
        ),
        None,
    )
    assert line is not None, f"no line for {field} in:\n{message}"
    assert reason in line, f"{reason!r} not in {line!r}"


def test_every_field_at_fault_is_named() -> None:
    document = endpoint(
        container("a", Image="caffe"),
        container("b_", Bogus=1),
        EndpointName="bad name",
    )
    with pytest.raises(SpecError) as caught:
        parse_spec(document)
    fields = {line.split(":", 1)[0] for line in str(caught.value).splitlines()}
    assert {
        "EndpointName",
        "Containers[0].Image",
        "Containers[1].ContainerHostname",
        "Containers[1].Bogus",
    } <= fields


@pytest.mark.parametrize(
    ("name", "text", "reason"),
    [
        ("endpoint.yaml", "EndpointName: [unclosed\n", "is not valid YAML"),
        ("endpoint.yaml", "EndpointName: a\n  Containers: - b\n", "is not valid YAML"),
        ("endpoint.json", '{"EndpointName": "a",', "is not valid JSON"),
    ],
    ids=["unclosed flow list", "bad indentation", "truncated json"],
)
def test_unparseable_file_names_the_file(tmp_path: Path, name: str, text: str, reason: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(path) in str(caught.value)
    assert reason in str(caught.value)


def test_missing_spec_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="cannot read spec"):
        load_spec(tmp_path / "absent.yaml")


def test_spec_error_is_a_value_error() -> None:
    # CLI code and users catch ValueError; SpecError must stay one.
    with pytest.raises(ValueError):
        parse_spec({"EndpointName": "x"})


def test_fixed_replica_count_is_accepted():
    spec = parse_spec(
        {
            "EndpointName": "e",
            "Containers": [
                {
                    "ContainerHostname": "c",
                    "Image": "python",
                    "AutoScaling": {"MinCapacity": 3, "MaxCapacity": 3},
                }
            ],
        }
    )
    assert spec.Containers[0].replicas == 3


# --- AccessControl ---------------------------------------------------------------------------

ROOT = Path(__file__).resolve().parents[2]
ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}


def write_identities(
    folder: Path, policy: dict[str, Any] = ALLOW_ALL, name: str = "identities.yaml"
) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "policy.json").write_text(json.dumps(policy))
    identities = {
        "Identities": [
            {
                "Principal": "team-a",
                "AccessKeyId": "AKIASPECTEST00001",
                "SecretAccessKey": "spec-test-secret-0001",
                "PolicyDocuments": ["policy.json"],
            }
        ]
    }
    return write_yaml(folder, identities, name)


def test_access_control_is_loaded_relative_to_the_spec(
    spec_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir("/")
    write_identities(spec_dir / "secrets")
    path = write_yaml(
        spec_dir,
        endpoint(
            container(ModelDataUrl="models/english/1"),
            AccessControl={"IdentitiesFile": "secrets/identities.yaml"},
        ),
    )
    spec = load_spec(path)
    assert spec.AccessControl.IdentitiesFile == str(
        (spec_dir / "secrets" / "identities.yaml").resolve()
    )
    identity = spec.AccessControl.identities.by_access_key_id("AKIASPECTEST00001")
    assert identity.principal == "team-a" and [p.name for p in identity.policies] == ["policy.json"]


def test_identities_inside_a_model_directory_are_refused(spec_dir: Path) -> None:
    write_identities(spec_dir / "models" / "english" / "1")
    path = write_yaml(
        spec_dir,
        endpoint(
            container(ModelDataUrl="models/english/1"),
            AccessControl={"IdentitiesFile": "models/english/1/identities.yaml"},
        ),
    )
    with pytest.raises(
        SpecError, match=r"AccessControl.IdentitiesFile lies inside Containers\[0\].ModelDataUrl"
    ):
        load_spec(path)


def test_bad_policy_is_reported_with_statement_and_field(spec_dir: Path) -> None:
    write_identities(
        spec_dir,
        {
            "Statement": [
                {"Effect": "Allow", "Action": "*", "Resource": "*"},
                {"Effect": "Maybe", "Action": "*", "Resource": "*"},
            ]
        },
    )
    path = write_yaml(spec_dir, endpoint(AccessControl={"IdentitiesFile": "identities.yaml"}))
    with pytest.raises(SpecError) as raised:
        load_spec(path)
    assert str(raised.value) == (
        "AccessControl: IdentitiesFile identities.yaml: Identities[0].PolicyDocuments[0] (policy.json): "
        "Statement[1].Effect: Input should be 'Allow' or 'Deny'"
    )


def test_identities_file_argument_replaces_the_spec(
    spec_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    other = write_identities(tmp_path_factory.mktemp("elsewhere"))
    path = write_yaml(spec_dir, endpoint(AccessControl={"IdentitiesFile": "missing.yaml"}))
    assert load_spec(path, identities_file=other).AccessControl.IdentitiesFile == str(
        other.resolve()
    )
    plain = write_yaml(spec_dir, endpoint(), "plain.yaml")
    assert load_spec(plain).AccessControl is None
    assert load_spec(plain, identities_file=other).AccessControl is not None


def test_the_secure_example_validates(demo_models: Path, tmp_path: Path) -> None:
    # The example as shipped, laid out as in the repository, with freshly trained demo models.
    for name in (
        "examples/secure.yaml",
        "examples/identities.yaml",
        "policies/customips-and-common.json",
        "policies/all-but-special.json",
    ):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text((ROOT / name).read_text())
    (tmp_path / "examples" / "models").symlink_to(demo_models)
    spec = load_spec(tmp_path / "examples" / "secure.yaml")
    assert [c.ContainerHostname for c in spec.Containers] == [
        "customIps-iris",
        "common-wine",
        "special-labels",
    ]
    assert [i.principal for i in spec.AccessControl.identities.identities] == [
        "team-a",
        "team-b",
        "batch-job",
    ]


def test_multi_model_containers_are_accepted(spec_dir: Path) -> None:
    spec = parse_spec(
        endpoint(
            container(
                "local",
                Mode="MultiModel",
                ModelDataUrl="models",
                Environment={"SERVING_MAX_MODELS": "5"},
            ),
            container(
                "cloud",
                Mode="MultiModel",
                ModelDataUrl="s3://models-bucket/team-a/",
                MultiModelConfig={"ModelCacheSetting": "Disabled"},
            ),
        ),
        base_dir=spec_dir,
    )
    local, cloud = spec.Containers
    assert local.ModelDataUrl == str((spec_dir / "models").resolve())
    assert local.MultiModelConfig is None and local.Environment["SERVING_MAX_MODELS"] == "5"
    assert cloud.ModelDataUrl == "s3://models-bucket/team-a/"
    assert cloud.MultiModelConfig.ModelCacheSetting.value == "Disabled"


def test_custom_resources_place_replicas_and_ray_names_are_refused() -> None:
    spec = parse_spec(
        endpoint(container(Resources={"Cpus": 1, "Custom": {"gpu-node": 1, "zone:a": 0.5}}))
    )
    assert spec.Containers[0].Resources.Custom == {"gpu-node": 1, "zone:a": 0.5}
    with pytest.raises(
        SpecError, match=r"Containers\[0\]\.Resources\.Custom.*CPU, node:head: use Cpus"
    ):
        parse_spec(endpoint(container(Resources={"Custom": {"CPU": 1, "node:head": 1}})))
    with pytest.raises(SpecError, match=r"Containers\[0\]\.Resources\.Custom"):
        parse_spec(endpoint(container(Resources={"Custom": {"gpu-node": 0}})))


@pytest.mark.parametrize(
    ("value", "idempotent"), [(None, True), ("true", True), ("false", False), ("0", False)]
)
def test_idempotent_comes_from_the_environment(value: str | None, idempotent: bool) -> None:
    environment = {} if value is None else {"SERVING_IDEMPOTENT": value}
    assert (
        parse_spec(endpoint(container(Environment=environment))).Containers[0].idempotent
        is idempotent
    )
    with pytest.raises(SpecError, match="SERVING_IDEMPOTENT must be true or false"):
        parse_spec(endpoint(container(Environment={"SERVING_IDEMPOTENT": "maybe"})))


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ("not json", "is not JSON"),
        ('{"inputs": [], "extra": 1}', '"inputs": [...], "outputs": [...]'),
        (
            '{"inputs": [{"name": "x", "datatype": "FLOAT", "shape": [1]}]}',
            "inputs[0]: a name and one of the datatypes",
        ),
        (
            '{"outputs": [{"name": "y", "datatype": "FP32", "shape": [-2]}]}',
            "outputs[0]: shape must be",
        ),
        ('{"inputs": {"name": "x"}}', "inputs[0]"),
    ],
)
def test_a_tensor_signature_declaration_must_be_one(declared: str, words: str) -> None:
    # Open Inference metadata shows it as it is: refused when the spec is read, naming the variable
    # and the tensor.
    with pytest.raises(SpecError, match="SERVING_TENSOR_SIGNATURE") as refused:
        parse_spec(endpoint(container(Environment={"SERVING_TENSOR_SIGNATURE": declared})))
    assert words in str(refused.value)
    accepted = '{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [-1]}], "outputs": []}'
    assert parse_spec(endpoint(container(Environment={"SERVING_TENSOR_SIGNATURE": accepted})))
