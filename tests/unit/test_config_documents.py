"""serving.config.documents: what the spec, identities and policy documents share."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError, field_validator

from serving.access.identities import load_identities
from serving.config.documents import Document, describe, document_path, field_path


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
        "Items[0].Extra: unknown field (not part of a test document)"]


def test_every_line_of_a_message_carries_its_path() -> None:
    assert problems({"Items": [{"Name": "a"}, {"Name": "long"}]}) == [
        "Items[1].Name: too long", "Items[1].Name: keep it under 4"]


def test_a_problem_with_the_whole_document_is_named_by_the_root() -> None:
    assert problems({}, root="(spec)") == ["Items: Field required"]
    assert field_path(()) == "(document)" and field_path((), "(spec)") == "(spec)"
    assert field_path(("Statement", 1, "function-after[_x(), S]", "Effect")) == "Statement[1].Effect"


def test_a_rewrite_replaces_pydantic_s_message_but_never_the_unknown_field_one() -> None:
    lines = problems({"Items": [{"Name": 5, "Extra": 1}]}, rewrite=lambda item: f"{item['type']} here")
    assert lines == ["Items[0].Name: string_type here", "Items[0].Extra: unknown field (not part of a test document)"]


def test_documents_are_frozen() -> None:
    with pytest.raises(ValidationError):
        Inner(Name="a").Name = "b"  # type: ignore[misc]


def test_a_path_in_a_document_is_relative_to_its_folder_with_home_expanded(tmp_path: Path) -> None:
    assert document_path("models/a", tmp_path) == tmp_path / "models" / "a"
    assert document_path("/abs/a", tmp_path) == Path("/abs/a")
    assert document_path("~/a", tmp_path) == Path.home() / "a"
    assert document_path("models/a", None) == Path("models/a")


def test_identities_follow_the_same_path_rule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home, folder = tmp_path / "home", tmp_path / "config"
    home.mkdir(), folder.mkdir()
    monkeypatch.setenv("HOME", str(home))
    policy = '{"Statement": {"Effect": "Allow", "Action": "*", "Resource": "*"}}'
    (home / "mine.json").write_text(policy)
    (folder / "team.json").write_text(policy)
    (folder / "identities.yaml").write_text(yaml.safe_dump({"Identities": [
        {"Principal": "p", "ApiKey": "k" * 20, "PolicyDocuments": ["~/mine.json", "team.json"]}]}))
    loaded = load_identities(folder / "identities.yaml")
    assert [policy.name for policy in loaded.identities[0].policies] == ["mine.json", "team.json"]
