"""serving.access.policies: IAM-style evaluation (table-driven and property-based) and document
validation."""

from __future__ import annotations

import fnmatch
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serving.access.policies import (
    ACTION_INVOKE,
    KEY_TARGET_CONTAINER,
    KEY_TARGET_MODEL,
    PolicyError,
    RequestContext,
    endpoint_arn,
    evaluate,
    glob_match,
    load_policy,
    parse_policy,
)

ROOT = Path(__file__).resolve().parents[2]
ARN = "arn:aws:sagemaker:us-east-1:000000000000:endpoint/mce-secure"
ANY_ENDPOINT = "arn:aws:sagemaker:*:*:endpoint/*"
# Hypothesis runs are bounded by example count, never by time (no timing assertions).
PROPERTIES = settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])


def allow(**fields: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": ACTION_INVOKE, "Resource": ANY_ENDPOINT, **fields}


def deny(**fields: Any) -> dict[str, Any]:
    return {"Effect": "Deny", "Action": ACTION_INVOKE, "Resource": ANY_ENDPOINT, **fields}


def only(**fields: Any) -> dict[str, Any]:
    """A statement with just the given fields (for NotAction / NotResource)."""
    return fields


def request(
    container: str | None = "customIps-iris",
    model: str | None = None,
    action: str = ACTION_INVOKE,
    resource: str = ARN,
    **keys: str,
) -> RequestContext:
    context = dict(keys)
    if container is not None:
        context[KEY_TARGET_CONTAINER] = container
    if model is not None:
        context[KEY_TARGET_MODEL] = model
    return RequestContext(action, resource, context)


def like(*values: str, key: str = KEY_TARGET_CONTAINER, op: str = "StringLike") -> dict[str, Any]:
    return {op: {key: list(values)}}


# (name, statements of one document, request, allowed, deciding statement label or None)
CASES: list[tuple[str, list[dict[str, Any]], RequestContext, bool, str | None]] = [
    # --- Action / NotAction: names are case-insensitive, * and ? wildcards
    ("exact action and resource", [allow(Resource=ARN)], request(), True, "p#Statement[0]"),
    (
        "allow everything",
        [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "action in another case",
        [allow(Action="SAGEMAKER:invokeendpoint")],
        request(),
        True,
        "p#Statement[0]",
    ),
    ("action wildcard *", [allow(Action="sagemaker:Invoke*")], request(), True, "p#Statement[0]"),
    ("service wildcard", [allow(Action="sagemaker:*")], request(), True, "p#Statement[0]"),
    (
        "action wildcard ?",
        [allow(Action="sagemaker:InvokeEndpoin?")],
        request(),
        True,
        "p#Statement[0]",
    ),
    ("other action only", [allow(Action="sagemaker:CreateEndpoint")], request(), False, None),
    ("action prefix is not a match", [allow(Action="sagemaker:Invoke")], request(), False, None),
    (
        "action list, one matches",
        [allow(Action=["sagemaker:CreateEndpoint", ACTION_INVOKE])],
        request(),
        True,
        "p#Statement[0]",
    ),
    ("other service", [allow(Action="s3:InvokeEndpoint")], request(), False, None),
    (
        "NotAction of another action allows",
        [only(Effect="Allow", NotAction="sagemaker:CreateEndpoint", Resource="*")],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "NotAction covering the action",
        [only(Effect="Allow", NotAction="sagemaker:Invoke*", Resource="*")],
        request(),
        False,
        None,
    ),
    (
        "NotAction in another case",
        [only(Effect="Allow", NotAction="SageMaker:INVOKEENDPOINT", Resource="*")],
        request(),
        False,
        None,
    ),
    (
        "Deny with NotAction of another action denies",
        [allow(), only(Effect="Deny", NotAction="sagemaker:DescribeEndpoint", Resource="*")],
        request(),
        False,
        "p#Statement[1]",
    ),
    (
        "Deny with NotAction of this action does not",
        [allow(), only(Effect="Deny", NotAction=ACTION_INVOKE, Resource="*")],
        request(),
        True,
        "p#Statement[0]",
    ),
    # --- Resource / NotResource: ARNs are case-sensitive, endpoint names are lower-cased in them
    ("exact ARN", [allow(Resource=ARN)], request(), True, "p#Statement[0]"),
    (
        "endpoint name in mixed case never matches",
        [allow(Resource=ARN.replace("mce-secure", "MCE-Secure"))],
        request(),
        False,
        None,
    ),
    (
        "region wildcard",
        [allow(Resource="arn:aws:sagemaker:*:000000000000:endpoint/mce-secure")],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "other region",
        [allow(Resource="arn:aws:sagemaker:eu-west-1:000000000000:endpoint/mce-secure")],
        request(),
        False,
        None,
    ),
    (
        "other account",
        [allow(Resource="arn:aws:sagemaker:us-east-1:111111111111:endpoint/mce-secure")],
        request(),
        False,
        None,
    ),
    (
        "resource wildcard ?",
        [allow(Resource="arn:aws:sagemaker:us-east-1:000000000000:endpoint/mce-secur?")],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "endpoint prefix wildcard",
        [allow(Resource="arn:aws:sagemaker:us-east-1:000000000000:endpoint/mce-*")],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "other endpoint",
        [allow(Resource="arn:aws:sagemaker:us-east-1:000000000000:endpoint/other")],
        request(),
        False,
        None,
    ),
    (
        "an ARN with extra segments never matches",
        [allow(Resource="arn:aws:sagemaker:us-east-1*:endpoint/mce-secure:x:y")],
        request(),
        False,
        None,
    ),
    (
        "NotResource of another endpoint",
        [only(Effect="Allow", Action=ACTION_INVOKE, NotResource=ARN.replace("secure", "other"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "NotResource of this endpoint",
        [
            only(
                Effect="Allow",
                Action=ACTION_INVOKE,
                NotResource="arn:aws:sagemaker:*:*:endpoint/mce-*",
            )
        ],
        request(),
        False,
        None,
    ),
    # --- Deny wins, in any order, in any document of the identity
    ("deny overrides allow", [allow(), deny()], request(), False, "p#Statement[1]"),
    ("deny listed first still wins", [deny(), allow()], request(), False, "p#Statement[0]"),
    (
        "deny with a Sid is named by it",
        [allow(), deny(Sid="NoSpecial", Condition=like("special*"))],
        request("special-labels"),
        False,
        "p#NoSpecial",
    ),
    (
        "non-matching deny leaves the allow",
        [allow(), deny(Condition=like("special*"))],
        request("common-wine"),
        True,
        "p#Statement[0]",
    ),
    (
        "first matching allow decides",
        [allow(Sid="First"), allow(Sid="Second")],
        request(),
        True,
        "p#First",
    ),
    (
        "no statement at all matches",
        [deny(Condition=like("special*"))],
        request("common-wine"),
        False,
        None,
    ),
    # --- Conditions: values case-sensitive, keys case-insensitive
    (
        "StringEquals exact",
        [allow(Condition=like("customIps-iris", op="StringEquals"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "StringEquals is case-sensitive",
        [allow(Condition=like("CUSTOMIPS-IRIS", op="StringEquals"))],
        request(),
        False,
        None,
    ),
    (
        "StringEquals treats * literally",
        [allow(Condition=like("customIps*", op="StringEquals"))],
        request(),
        False,
        None,
    ),
    (
        "condition key in another case",
        [
            allow(
                Condition={"StringEquals": {"SageMaker:targetcontainerhostname": "customIps-iris"}}
            )
        ],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "StringLike prefix",
        [allow(Condition=like("customIps*", "common*"))],
        request("common-wine"),
        True,
        "p#Statement[0]",
    ),
    (
        "StringLike refuses others",
        [allow(Condition=like("customIps*", "common*"))],
        request("special-labels"),
        False,
        None,
    ),
    (
        "StringLike is case-sensitive",
        [allow(Condition=like("customips*"))],
        request("customIps-iris"),
        False,
        None,
    ),
    (
        "StringLike ? is one character",
        [allow(Condition=like("common-win?"))],
        request("common-wine"),
        True,
        "p#Statement[0]",
    ),
    (
        "StringLike ? is not zero characters",
        [allow(Condition=like("common-wine?"))],
        request("common-wine"),
        False,
        None,
    ),
    (
        "StringNotEquals other value",
        [allow(Condition=like("special-labels", op="StringNotEquals"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "StringNotEquals same value",
        [allow(Condition=like("special-labels", op="StringNotEquals"))],
        request("special-labels"),
        False,
        None,
    ),
    (
        "StringNotLike other",
        [allow(Condition=like("special*", op="StringNotLike"))],
        request("common-wine"),
        True,
        "p#Statement[0]",
    ),
    (
        "StringNotLike match",
        [allow(Condition=like("special*", op="StringNotLike"))],
        request("special-x"),
        False,
        None,
    ),
    (
        "StringNotEquals lists are all excluded",
        [allow(Condition=like("a", "customIps-iris", op="StringNotEquals"))],
        request(),
        False,
        None,
    ),
    # --- missing condition keys (no TargetModel in the request)
    (
        "missing key fails StringEquals",
        [allow(Condition=like("m.tar.gz", key=KEY_TARGET_MODEL, op="StringEquals"))],
        request(),
        False,
        None,
    ),
    (
        "missing key fails StringLike",
        [allow(Condition=like("*", key=KEY_TARGET_MODEL))],
        request(),
        False,
        None,
    ),
    (
        "missing key passes StringNotEquals",
        [allow(Condition=like("m.tar.gz", key=KEY_TARGET_MODEL, op="StringNotEquals"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "missing key passes StringNotLike",
        [allow(Condition=like("m*", key=KEY_TARGET_MODEL, op="StringNotLike"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "missing key fails ForAnyValue",
        [allow(Condition=like("*", key=KEY_TARGET_MODEL, op="ForAnyValue:StringLike"))],
        request(),
        False,
        None,
    ),
    (
        "missing key passes ForAllValues",
        [allow(Condition=like("m*", key=KEY_TARGET_MODEL, op="ForAllValues:StringLike"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "deny on a missing key with a negated operator",
        [allow(), deny(Condition=like("m*", key=KEY_TARGET_MODEL, op="StringNotLike"))],
        request(),
        False,
        "p#Statement[1]",
    ),
    (
        "present model matches",
        [allow(Condition=like("model-?.tar.gz", key=KEY_TARGET_MODEL))],
        request(model="model-3.tar.gz"),
        True,
        "p#Statement[0]",
    ),
    (
        "ForAnyValue with a matching value",
        [allow(Condition=like("customIps-iris", op="ForAnyValue:StringEquals"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    (
        "ForAllValues with another value",
        [allow(Condition=like("common*", op="ForAllValues:StringLike"))],
        request(),
        False,
        None,
    ),
    (
        "ForAnyValue:StringNotLike",
        [allow(Condition=like("special*", op="ForAnyValue:StringNotLike"))],
        request(),
        True,
        "p#Statement[0]",
    ),
    # --- several keys and operators are ANDed, several values ORed
    (
        "two keys both hold",
        [
            allow(
                Condition={
                    "StringLike": {KEY_TARGET_CONTAINER: "customIps*", KEY_TARGET_MODEL: "m*"}
                }
            )
        ],
        request(model="m1"),
        True,
        "p#Statement[0]",
    ),
    (
        "two keys, one fails",
        [
            allow(
                Condition={
                    "StringLike": {KEY_TARGET_CONTAINER: "customIps*", KEY_TARGET_MODEL: "m*"}
                }
            )
        ],
        request(model="x1"),
        False,
        None,
    ),
    (
        "two operators, one fails",
        [allow(Condition={**like("customIps*"), **like("customIps-iris", op="StringNotEquals")})],
        request(),
        False,
        None,
    ),
    (
        "a value list is ORed",
        [allow(Condition=like("nope", "customIps-*", "other"))],
        request(),
        True,
        "p#Statement[0]",
    ),
]


@pytest.mark.parametrize(
    ("statements", "context", "allowed", "label"), [c[1:] for c in CASES], ids=[c[0] for c in CASES]
)
def test_evaluation(
    statements: list[dict[str, Any]], context: RequestContext, allowed: bool, label: str | None
) -> None:
    policy = parse_policy({"Version": "2012-10-17", "Statement": statements}, "p")
    decision = evaluate([policy], context)
    assert decision.allowed is allowed
    assert decision.statement == label


def test_deny_in_another_document_wins() -> None:
    permissive = parse_policy({"Statement": [allow()]}, "allow.json")
    restrictive = parse_policy(
        {"Statement": [deny(Sid="NoSpecial", Condition=like("special*"))]}, "deny.json"
    )
    for order in ([permissive, restrictive], [restrictive, permissive]):
        decision = evaluate(order, request("special-labels"))
        assert (decision.allowed, decision.statement) == (False, "deny.json#NoSpecial")
        assert evaluate(order, request("common-wine")).allowed


def test_no_policies_deny() -> None:
    decision = evaluate([], request())
    assert not decision.allowed and not decision.explicit


def test_single_statement_object_is_accepted() -> None:
    policy = parse_policy({"Version": "2012-10-17", "Statement": allow(Action="sagemaker:*")})
    assert evaluate([policy], request()).allowed


def test_endpoint_arn_lower_cases_the_name() -> None:
    assert (
        endpoint_arn("eu-west-1", "123456789012", "Mce-Secure")
        == "arn:aws:sagemaker:eu-west-1:123456789012:endpoint/mce-secure"
    )


# --- the documented SageMaker example, with the shipped policy files -----------------------


@pytest.mark.parametrize(
    ("policy_file", "container", "allowed"),
    [
        ("customips-and-common.json", "customIps-iris", True),
        ("customips-and-common.json", "common-wine", True),
        ("customips-and-common.json", "special-labels", False),
        ("customips-and-common.json", "other", False),
        ("all-but-special.json", "customIps-iris", True),
        ("all-but-special.json", "common-wine", True),
        ("all-but-special.json", "other", True),
        ("all-but-special.json", "special-labels", False),
    ],
)
def test_example_policies(policy_file: str, container: str, allowed: bool) -> None:
    policy = load_policy(ROOT / "policies" / policy_file)
    assert evaluate([policy], request(container)).allowed is allowed


# --- invalid documents are refused, naming the statement and field --------------------------

INVALID = [
    ("not an object", [allow()], ["(document)", "JSON object"]),
    ("no Statement", {"Version": "2012-10-17"}, ["Statement: Field required"]),
    ("empty Statement list", {"Statement": []}, ["Statement: List should have at least 1 item"]),
    (
        "bad Version",
        {"Version": "2020-01-01", "Statement": [allow()]},
        ["Version: Input should be '2012-10-17' or '2008-10-17'"],
    ),
    ("unknown top-level field", {"Statement": [allow()], "Owner": "me"}, ["Owner: unknown field"]),
    (
        "bad Effect in the second statement",
        {"Statement": [allow(), allow(Effect="allow")]},
        ["Statement[1].Effect: Input should be 'Allow' or 'Deny'"],
    ),
    (
        "missing Effect",
        {"Statement": [only(Action="*", Resource="*")]},
        ["Statement[0].Effect: Field required"],
    ),
    (
        "Action and NotAction",
        {"Statement": [allow(NotAction="sagemaker:CreateEndpoint")]},
        ["Statement[0]: exactly one of Action or NotAction is required"],
    ),
    (
        "no Action",
        {"Statement": [only(Effect="Allow", Resource="*")]},
        ["Statement[0]: exactly one of Action or NotAction"],
    ),
    (
        "no Resource",
        {"Statement": [only(Effect="Allow", Action="*")]},
        ["Statement[0]: exactly one of Resource or NotResource"],
    ),
    (
        "Principal in an identity policy",
        {"Statement": [allow(Principal="*")]},
        ["Statement[0].Principal: unknown field"],
    ),
    (
        "empty Action list",
        {"Statement": [allow(Action=[])]},
        ["Statement[0].Action: List should have at least 1 item"],
    ),
    (
        "action without a service",
        {"Statement": [allow(), allow(Action="InvokeEndpoint")]},
        ["Statement[1].Action: 'InvokeEndpoint' is not an action"],
    ),
    (
        "resource that is not an ARN",
        {"Statement": [allow(Resource="endpoint/mce-secure")]},
        ["Statement[0].Resource: 'endpoint/mce-secure' is not a resource"],
    ),
    (
        "unsupported operator",
        {"Statement": [allow(Condition={"StringEqualsIgnoreCase": {KEY_TARGET_CONTAINER: "a"}})]},
        ["Statement[0].Condition: unsupported condition operator 'StringEqualsIgnoreCase'"],
    ),
    (
        "unsupported condition key",
        {"Statement": [allow(Condition={"StringLike": {"aws:SourceIp": "10.*"}})]},
        ["Statement[0].Condition: StringLike: unsupported condition key 'aws:SourceIp'"],
    ),
    (
        "no condition values",
        {"Statement": [allow(Condition={"StringLike": {KEY_TARGET_CONTAINER: []}})]},
        ["Statement[0].Condition", "lists no values"],
    ),
    (
        "condition value not a string",
        {"Statement": [allow(Condition={"StringLike": {KEY_TARGET_CONTAINER: [1]}})]},
        [
            f"Statement[0].Condition.StringLike.{KEY_TARGET_CONTAINER}[0]: Input should be a valid string"
        ],
    ),
    (
        "duplicate Sid",
        {"Statement": [allow(Sid="A"), deny(Sid="A")]},
        ["Statement[1].Sid 'A' duplicates Statement[0]"],
    ),
    ("Sid with spaces", {"Statement": [allow(Sid="my statement")]}, ["Statement[0].Sid"]),
]


@pytest.mark.parametrize(
    ("document", "fragments"), [c[1:] for c in INVALID], ids=[c[0] for c in INVALID]
)
def test_invalid_documents_are_refused(document: Any, fragments: list[str]) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy(document)
    for fragment in fragments:
        assert fragment in str(raised.value), str(raised.value)


def test_every_problem_is_reported(tmp_path: Path) -> None:
    with pytest.raises(PolicyError) as raised:
        parse_policy({"Statement": [allow(Effect="Permit"), allow(Resource="bucket")]})
    lines = str(raised.value).splitlines()
    assert any(line.startswith("Statement[0].Effect:") for line in lines)
    assert any(line.startswith("Statement[1].Resource:") for line in lines)


def test_duplicate_json_keys_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "dup.json"
    path.write_text(
        '{"Statement": [{"Effect": "Deny", "Effect": "Allow", "Action": "*", "Resource": "*"}]}'
    )
    with pytest.raises(PolicyError, match="duplicate key 'Effect'"):
        load_policy(path)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match="cannot read policy"):
        load_policy(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(PolicyError, match="not valid JSON"):
        load_policy(tmp_path / "bad.json")


def test_loaded_policy_round_trips_through_a_record() -> None:
    policy = load_policy(ROOT / "policies" / "all-but-special.json")
    again = parse_policy(
        json.loads(json.dumps(policy.to_record()["Document"])), policy.to_record()["Name"]
    )
    for container in ("customIps-iris", "special-labels"):
        assert evaluate([again], request(container)) == evaluate([policy], request(container))


# --- properties ------------------------------------------------------------------------------

NAMES = st.text(alphabet="abS-", min_size=0, max_size=5)
PATTERNS = st.text(alphabet="abS-*?", min_size=0, max_size=5)
OPERATORS = st.sampled_from(
    [
        f"{prefix}{op}"
        for prefix in ("", "ForAnyValue:", "ForAllValues:")
        for op in ("StringEquals", "StringNotEquals", "StringLike", "StringNotLike")
    ]
)
CONDITIONS = st.dictionaries(
    OPERATORS,
    st.dictionaries(
        st.sampled_from([KEY_TARGET_CONTAINER, KEY_TARGET_MODEL]),
        st.lists(PATTERNS, min_size=1, max_size=3),
        min_size=1,
        max_size=2,
    ),
    max_size=2,
)
ACTIONS = st.lists(
    st.sampled_from(
        [
            "*",
            ACTION_INVOKE,
            "sagemaker:invoke*",
            "sagemaker:CreateEndpoint",
            "sagemaker:?nvokeEndpoint",
        ]
    ),
    min_size=1,
    max_size=2,
)
RESOURCES = st.lists(
    st.sampled_from(
        [
            "*",
            ARN,
            ANY_ENDPOINT,
            "arn:aws:sagemaker:*:*:endpoint/other",
            "arn:aws:sagemaker:us-east-1:000000000000:endpoint/mce-*",
        ]
    ),
    min_size=1,
    max_size=2,
)


@st.composite
def statements(draw: st.DrawFn, effect: str | None = None) -> dict[str, Any]:
    statement: dict[str, Any] = {"Effect": effect or draw(st.sampled_from(["Allow", "Deny"]))}
    statement["NotAction" if draw(st.booleans()) and draw(st.booleans()) else "Action"] = draw(
        ACTIONS
    )
    statement["NotResource" if draw(st.booleans()) and draw(st.booleans()) else "Resource"] = draw(
        RESOURCES
    )
    condition = draw(CONDITIONS)
    if condition:
        statement["Condition"] = condition
    return statement


REQUESTS = st.builds(
    lambda container, model, endpoint: request(
        container, model, resource=endpoint_arn("us-east-1", "000000000000", endpoint)
    ),
    NAMES,
    st.one_of(st.none(), NAMES),
    st.sampled_from(["mce-secure", "other", "MCE-X"]),
)


def allowed(statement_list: list[dict[str, Any]], context: RequestContext) -> bool:
    if not statement_list:
        return False
    return evaluate([parse_policy({"Statement": statement_list})], context).allowed


@PROPERTIES
@given(st.lists(statements(), max_size=4), statements(effect="Deny"), REQUESTS)
def test_adding_a_deny_never_allows_more(
    base: list[dict[str, Any]], extra: dict[str, Any], context: RequestContext
) -> None:
    if allowed(base + [extra], context):
        assert allowed(base, context)


@PROPERTIES
@given(st.lists(statements(), max_size=4), statements(effect="Allow"), REQUESTS)
def test_removing_an_allow_never_allows_more(
    base: list[dict[str, Any]], extra: dict[str, Any], context: RequestContext
) -> None:
    # `base` is stricter than `base + [extra]`: everything it allows, the larger document allows.
    if allowed(base, context):
        assert allowed(base + [extra], context)


@PROPERTIES
@given(
    statements(effect="Allow"),
    CONDITIONS,
    st.lists(statements(effect="Deny"), max_size=2),
    REQUESTS,
)
def test_a_condition_only_narrows_an_allow(
    statement: dict[str, Any],
    condition: dict[str, Any],
    denies: list[dict[str, Any]],
    context: RequestContext,
) -> None:
    stricter = {**statement, "Condition": {**statement.get("Condition", {}), **condition}}
    if not condition or set(condition) & set(statement.get("Condition", {})):
        return  # merging operators would replace, not add, a condition
    if allowed([stricter, *denies], context):
        assert allowed([statement, *denies], context)


@PROPERTIES
@given(st.lists(statements(), min_size=1, max_size=5), st.randoms(use_true_random=False), REQUESTS)
def test_statement_order_does_not_matter(
    statement_list: list[dict[str, Any]], random, context: RequestContext
) -> None:
    shuffled = list(statement_list)
    random.shuffle(shuffled)
    assert allowed(statement_list, context) == allowed(shuffled, context)


@PROPERTIES
@given(st.lists(statements(), max_size=4), REQUESTS)
def test_deny_everything_denies_everything(
    statement_list: list[dict[str, Any]], context: RequestContext
) -> None:
    assert not allowed(
        statement_list + [{"Effect": "Deny", "Action": "*", "Resource": "*"}], context
    )


@PROPERTIES
@given(PATTERNS, NAMES)
def test_wildcards_agree_with_fnmatch(pattern: str, value: str) -> None:
    assert glob_match(pattern, value) == fnmatch.fnmatchcase(value, pattern)
