"""serving.documents: what the spec, identities and policy documents share, and what loading a spec
costs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError, field_validator

from serving.access.identities import load_identities
from serving.documents import Document, describe, document_path, field_path

ROOT = Path(__file__).resolve().parents[2]


class Inner(Document):
    Name: str

    @field_validator("Name")
    @classmethod
    def _short(cls, name: str) -> str:
        if len(name) > 3:
            raise ValueError("too long\nkeep it under 4")
        return name


class Outer(Document):
    Items: list[Inner]


def problems(document: object, **options: object) -> list[str]:
    with pytest.raises(ValidationError) as raised:
        Outer.model_validate(document)
    return describe(raised.value, "a test document", **options)


def test_unknown_fields_are_refused_naming_the_document() -> None:
    assert problems({"Items": [{"Name": "a", "Extra": 1}]}) == [
        "Items[0].Extra: unknown field (not part of a test document)"
    ]


def test_every_line_of_a_message_carries_its_path() -> None:
    assert problems({"Items": [{"Name": "a"}, {"Name": "long"}]}) == [
        "Items[1].Name: too long",
        "Items[1].Name: keep it under 4",
    ]


def test_a_problem_with_the_whole_document_is_named_by_the_root() -> None:
    assert problems({}, root="(spec)") == ["Items: Field required"]
    assert field_path(()) == "(document)" and field_path((), "(spec)") == "(spec)"
    assert (
        field_path(("Statement", 1, "function-after[_x(), S]", "Effect")) == "Statement[1].Effect"
    )


def test_a_rewrite_replaces_pydantic_s_message_but_never_the_unknown_field_one() -> None:
    lines = problems(
        {"Items": [{"Name": 5, "Extra": 1}]}, rewrite=lambda item: f"{item['type']} here"
    )
    assert lines == [
        "Items[0].Name: string_type here",
        "Items[0].Extra: unknown field (not part of a test document)",
    ]


def test_documents_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Inner(Name="a").Name = "b"  # type: ignore[misc]


def test_a_path_in_a_document_is_relative_to_its_folder_with_home_expanded(tmp_path: Path) -> None:
    assert document_path("models/a", tmp_path) == tmp_path / "models" / "a"
    assert document_path("/abs/a", tmp_path) == Path("/abs/a")
    assert document_path("~/a", tmp_path) == Path.home() / "a"
    assert document_path("models/a", None) == Path("models/a")


def test_identities_follow_the_same_path_rule(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home, folder = tmp_path / "home", tmp_path / "config"
    home.mkdir(), folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    policy = '{"Statement": {"Effect": "Allow", "Action": "*", "Resource": "*"}}'
    (home / "mine.json").write_text(policy)
    (folder / "team.json").write_text(policy)
    (folder / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {
                        "Principal": "p",
                        "ApiKey": "k" * 20,
                        "PolicyDocuments": ["~/mine.json", "team.json"],
                    }
                ]
            }
        )
    )
    loaded = load_identities(folder / "identities.yaml")
    assert [policy.name for policy in loaded.identities[0].policies] == ["mine.json", "team.json"]


# Validating a spec (`serving validate`, the control routes) must not pay for the request path:
# botocore's signer is needed only to verify a signature, NumPy and the frameworks only in a
# replica.
HEAVY = (
    "botocore.auth",
    "botocore.awsrequest",
    "botocore.credentials",
    "numpy",
    "torch",
    "tensorflow",
    "onnxruntime",
    "sklearn",
)

LIST_HEAVY = """
heavy = sys.argv[-1].split(",")
print(json.dumps(sorted({name for name in heavy for m in sys.modules if m == name or m.startswith(name + ".")})))
"""


def heavy_modules_after(code: str, *arguments: str) -> list[str]:
    """Which of HEAVY a fresh interpreter (this session has long since imported them all) holds
    after `code`."""
    environment = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            "import json, sys\n" + code + LIST_HEAVY,
            *arguments,
            ",".join(HEAVY),
        ],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_loading_a_spec_with_access_control_imports_no_signer_and_no_framework(
    tmp_path: Path,
) -> None:
    (tmp_path / "model").mkdir()
    spec = tmp_path / "endpoint.yaml"
    spec.write_text(
        "EndpointName: light\n"
        "Containers:\n"
        "  - {ContainerHostname: iris, Image: sklearn, ModelDataUrl: model}\n"
        f"AccessControl: {{IdentitiesFile: {json.dumps(str(ROOT / 'examples' / 'identities.yaml'))}}}\n"
    )
    load = (
        "from serving.config.spec import load_spec\n"
        "spec = load_spec(sys.argv[1])\n"
        "assert [i.principal for i in spec.AccessControl.identities.identities] == ['team-a', 'team-b', 'batch-job']\n"
    )
    assert heavy_modules_after(load, str(spec)) == []


def test_botocore_s_signer_is_imported_by_a_verifier_not_by_its_module() -> None:
    assert heavy_modules_after("import serving.access.sigv4\n") == []
    made = (
        "from serving.access.identities import Identities\n"
        "from serving.access.sigv4 import Authenticator\n"
        "Authenticator(Identities([]), 'us-east-1')\n"
    )
    assert {"botocore.auth", "botocore.credentials"} <= set(heavy_modules_after(made))
