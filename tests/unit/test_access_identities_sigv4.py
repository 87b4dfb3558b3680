"""serving.access (identities, sigv4): identities files, and requests signed by real boto3 /
botocore verified as they arrive."""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest
import yaml
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from serving.access.identities import (
    Identities,
    IdentitiesError,
    load_identities,
    load_reference,
)
from serving.access.sigv4 import MAX_SKEW_S, Authenticator, RawRequest
from serving.errors import (
    InvalidSignatureError,
    MissingAuthenticationTokenError,
    ServingError,
    UnrecognizedClientError,
)

ROOT = Path(__file__).resolve().parents[2]
KEY_A, SECRET_A = "AKIATESTTEAMA0001", "team-a-secret-for-unit-tests"
KEY_B, SECRET_B = "AKIATESTTEAMB0002", "team-b-secret-for-unit-tests"
API_KEY = "batch-job-api-key-for-unit-tests"
URL = "http://127.0.0.1:8080"


class _Captured(Exception):
    """Raised from botocore's before-send hook: carries the request boto3 would have sent."""

    def __init__(self, request) -> None:
        self.request = request


def boto3_request(
    key_id: str = KEY_A,
    secret: str = SECRET_A,
    region: str = "us-east-1",
    endpoint: str = "mce-secure",
    target: str | None = "customIps-iris",
    body: bytes = b"[[5.1, 3.5, 1.4, 0.2]]",
) -> RawRequest:
    """An InvokeEndpoint request exactly as an unmodified boto3 client signs and sends it."""
    client = boto3.client(
        "sagemaker-runtime",
        endpoint_url=URL,
        region_name=region,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
    )

    def capture(request, **_):
        raise _Captured(request)

    client.meta.events.register("before-send.sagemaker-runtime.InvokeEndpoint", capture)
    arguments = {"EndpointName": endpoint, "ContentType": "application/json", "Body": body}
    if target is not None:
        arguments["TargetContainerHostname"] = target
    with pytest.raises(_Captured) as captured:
        client.invoke_endpoint(**arguments)
    return wire(captured.value.request)


def wire(prepared) -> RawRequest:
    """What the server receives for a prepared botocore request (the HTTP client adds Host)."""
    url = urlsplit(prepared.url)
    headers = [("host", url.netloc)]
    for name, value in prepared.headers.items():
        headers.append((name, value.decode() if isinstance(value, bytes) else str(value)))
    body = prepared.body or b""
    return RawRequest(
        prepared.method,
        url.path,
        url.query,
        tuple(headers),
        body if isinstance(body, bytes) else body.encode(),
    )


def signed_by_botocore(
    service: str = "sagemaker",
    region: str = "us-east-1",
    headers: dict[str, str] | None = None,
    body: bytes = b"[1]",
) -> RawRequest:
    """A request signed by botocore's SigV4Auth directly (for scopes boto3's runtime client never
    uses)."""
    request = AWSRequest(
        "POST",
        f"{URL}/endpoints/mce-secure/invocations",
        headers={"Content-Type": "application/json", **(headers or {})},
        data=body,
    )
    SigV4Auth(Credentials(KEY_A, SECRET_A), service, region).add_auth(request)
    return wire(request.prepare())


def with_header(request: RawRequest, name: str, value: str | None) -> RawRequest:
    """`request` with header `name` replaced (or removed when value is None)."""
    headers = tuple((k, v) for k, v in request.headers if k.lower() != name.lower())
    if value is not None:
        headers += ((name, value),)
    return replace(request, headers=headers)


def header(request: RawRequest, name: str) -> str:
    return request.values(name)[0]


def write_identities(
    folder: Path, identities: list[dict], policies: dict[str, dict] | None = None
) -> Path:
    for name, document in (policies or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(json.dumps(document))
    path = folder / "identities.yaml"
    path.write_text(yaml.safe_dump({"Identities": identities}))
    return path


@pytest.fixture(scope="module")
def identities(tmp_path_factory: pytest.TempPathFactory) -> Identities:
    folder = tmp_path_factory.mktemp("identities")
    (folder / "secrets").mkdir()
    (folder / "all-but-special.json").write_text(
        (ROOT / "policies" / "all-but-special.json").read_text()
    )
    path = write_identities(
        folder / "secrets",
        [  # one absolute and one relative policy path
            {
                "Principal": "team-a",
                "AccessKeyId": KEY_A,
                "SecretAccessKey": SECRET_A,
                "PolicyDocuments": [str(ROOT / "policies" / "customips-and-common.json")],
            },
            {
                "Principal": "team-b",
                "AccessKeyId": KEY_B,
                "SecretAccessKey": SECRET_B,
                "PolicyDocuments": ["../all-but-special.json"],
            },
            {
                "Principal": "batch-job",
                "ApiKey": API_KEY,
                "PolicyDocuments": ["../all-but-special.json"],
            },
        ],
    )
    return load_identities(path)


@pytest.fixture
def authenticate(identities: Identities) -> Callable[..., object]:
    def run(request: RawRequest, clock: Callable[[], float] = time.time, region: str = "us-east-1"):
        return Authenticator(identities, region, clock).authenticate(request)

    return run


def refused(
    authenticate, request: RawRequest, error: type[ServingError], fragment: str, **kwargs
) -> ServingError:
    with pytest.raises(error) as raised:
        authenticate(request, **kwargs)
    assert raised.value.status == 403
    assert fragment in raised.value.message, raised.value.message
    return raised.value


# --- Signature V4: accepted -------------------------------------------------------------------


def test_boto3_signed_requests_authenticate_their_principal(authenticate) -> None:
    caller = authenticate(boto3_request())
    assert (caller.principal, caller.scheme) == ("team-a", "sigv4")
    assert authenticate(boto3_request(KEY_B, SECRET_B)).principal == "team-b"


def test_request_without_target_or_body(authenticate) -> None:
    assert authenticate(boto3_request(target=None, body=b"")).principal == "team-a"


def test_unsigned_extra_headers_are_allowed(authenticate) -> None:
    # As in AWS: headers outside SignedHeaders (a proxy's X-Forwarded-For, ...) do not break the
    # signature.
    request = with_header(boto3_request(), "X-Forwarded-For", "10.0.0.1")
    assert authenticate(request).principal == "team-a"


def test_signed_payload_hash_header_is_accepted_when_it_matches(authenticate) -> None:
    body = b'{"a": 1}'
    request = signed_by_botocore(
        headers={"X-Amz-Content-SHA256": hashlib.sha256(body).hexdigest()}, body=body
    )
    assert "x-amz-content-sha256" in header(request, "authorization")
    assert authenticate(request).principal == "team-a"


def test_signatures_inside_the_clock_window_are_accepted(authenticate) -> None:
    request = boto3_request()
    assert authenticate(request, clock=lambda: time.time() + MAX_SKEW_S - 30).principal == "team-a"
    assert authenticate(request, clock=lambda: time.time() - MAX_SKEW_S + 30).principal == "team-a"


# --- Signature V4: refused --------------------------------------------------------------------


def test_wrong_secret(authenticate) -> None:
    refused(
        authenticate,
        boto3_request(KEY_A, "not-the-secret-of-team-a"),
        InvalidSignatureError,
        "signature we calculated does not match",
    )


def test_secret_of_another_identity(authenticate) -> None:
    refused(authenticate, boto3_request(KEY_A, SECRET_B), InvalidSignatureError, "does not match")


def test_unknown_access_key(authenticate) -> None:
    error = refused(
        authenticate,
        boto3_request("AKIAUNKNOWNKEY0000", SECRET_A),
        UnrecognizedClientError,
        "security token included in the request is invalid",
    )
    assert error.code == "UnrecognizedClientException"
    assert error.key_id == "AKIAUNKNOWNKEY0000"


def test_tampered_body(authenticate) -> None:
    request = boto3_request(body=b"[[5.1, 3.5, 1.4, 0.2]]")
    refused(
        authenticate,
        replace(request, body=b"[[9.9, 3.5, 1.4, 0.2]]"),
        InvalidSignatureError,
        "does not match",
    )


def test_tampered_signed_header(authenticate) -> None:
    request = with_header(
        boto3_request(target="customIps-iris"),
        "X-Amzn-SageMaker-Target-Container-Hostname",
        "special-labels",
    )
    refused(authenticate, request, InvalidSignatureError, "does not match")


def test_tampered_path(authenticate) -> None:
    request = boto3_request(endpoint="mce-secure")
    refused(
        authenticate,
        replace(request, path="/endpoints/mce-other/invocations"),
        InvalidSignatureError,
        "does not match",
    )


def test_tampered_query_and_method(authenticate) -> None:
    request = boto3_request()
    refused(
        authenticate, replace(request, query="debug=1"), InvalidSignatureError, "does not match"
    )
    refused(authenticate, replace(request, method="PUT"), InvalidSignatureError, "does not match")


def test_target_header_added_without_signing_it(authenticate) -> None:
    # A request signed without a target, replayed with one: the target must be covered by the
    # signature.
    request = with_header(
        boto3_request(target=None), "X-Amzn-SageMaker-Target-Container-Hostname", "special-labels"
    )
    refused(authenticate, request, InvalidSignatureError, "must be signed")


def test_signed_header_removed(authenticate) -> None:
    request = with_header(boto3_request(), "Content-Type", None)
    refused(authenticate, request, InvalidSignatureError, "Signed header 'content-type' is missing")


def test_payload_hash_header_that_does_not_match_the_body(authenticate) -> None:
    request = signed_by_botocore(
        headers={"X-Amz-Content-SHA256": hashlib.sha256(b"[1]").hexdigest()}, body=b"[1]"
    )
    refused(
        authenticate, replace(request, body=b"[2]"), InvalidSignatureError, "x-amz-content-sha256"
    )
    unsigned = signed_by_botocore(headers={"X-Amz-Content-SHA256": "UNSIGNED-PAYLOAD"})
    refused(authenticate, unsigned, InvalidSignatureError, "x-amz-content-sha256")


def test_expired_signature(authenticate) -> None:
    request = boto3_request()
    refused(
        authenticate,
        request,
        InvalidSignatureError,
        "Signature expired",
        clock=lambda: time.time() + MAX_SKEW_S + 60,
    )


def test_signature_from_the_future(authenticate) -> None:
    request = boto3_request()
    refused(
        authenticate,
        request,
        InvalidSignatureError,
        "Signature not yet current",
        clock=lambda: time.time() - MAX_SKEW_S - 60,
    )


@pytest.mark.parametrize(
    "amz_date",
    [
        "2026-11-27T10:00:00Z",
        "20261327T100000Z",
        "20260230T100000Z",
        "20261127T240000Z",
        "20261127T100000",
        "\u0662\u0660261127T100000Z",
    ],
)
def test_x_amz_date_not_in_the_basic_form_is_refused(authenticate, amz_date: str) -> None:
    refused(
        authenticate,
        with_header(boto3_request(), "X-Amz-Date", amz_date),
        InvalidSignatureError,
        "is not in the form YYYYMMDD'T'HHMMSS'Z'",
    )


def test_replay_outside_the_window_even_with_a_fresh_date_header(authenticate) -> None:
    request = boto3_request()
    later = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() + 3600))
    # Moving X-Amz-Date forward breaks the signature (it is signed); the scope date may break first.
    with pytest.raises((InvalidSignatureError,)):
        authenticate(with_header(request, "X-Amz-Date", later), clock=lambda: time.time() + 3600)


def test_wrong_region_scope(authenticate) -> None:
    refused(
        authenticate,
        boto3_request(region="eu-west-1"),
        InvalidSignatureError,
        "scoped to a valid region, not 'eu-west-1'",
    )
    # and the same request is fine for a server configured for that region
    assert authenticate(boto3_request(region="eu-west-1"), region="eu-west-1").principal == "team-a"


def test_wrong_service_scope(authenticate) -> None:
    refused(
        authenticate,
        signed_by_botocore(service="execute-api"),
        InvalidSignatureError,
        "correct service: 'sagemaker'",
    )


def test_botocore_signature_for_the_right_scope_verifies(authenticate) -> None:
    assert authenticate(signed_by_botocore()).principal == "team-a"


def test_malformed_authorization_headers(authenticate) -> None:
    request = boto3_request()
    refused(
        authenticate,
        with_header(request, "Authorization", "AWS4-HMAC-SHA256 Credential=x"),
        InvalidSignatureError,
        "requires 'Credential', 'SignedHeaders' and 'Signature'",
    )
    value = header(request, "authorization")
    refused(
        authenticate,
        with_header(request, "Authorization", value.replace("/aws4_request", "")),
        InvalidSignatureError,
        "Credential must have the form",
    )
    refused(
        authenticate,
        with_header(request, "Authorization", value.replace("host;", "")),
        InvalidSignatureError,
        "SignedHeaders must include 'host'",
    )
    twice = replace(request, headers=request.headers + (("Authorization", value),))
    refused(authenticate, twice, InvalidSignatureError, "more than one Authorization header")


# --- no credentials, other schemes, bearer keys -------------------------------------------------


def test_missing_authentication(authenticate) -> None:
    request = with_header(boto3_request(), "Authorization", None)
    error = refused(
        authenticate, request, MissingAuthenticationTokenError, "Missing Authentication Token"
    )
    assert error.code == "MissingAuthenticationTokenException"


def test_other_schemes_are_not_credentials(authenticate) -> None:
    request = with_header(boto3_request(), "Authorization", "Basic dXNlcjpwYXNz")
    refused(authenticate, request, MissingAuthenticationTokenError, "AWS4-HMAC-SHA256")


def bearer(token: str) -> RawRequest:
    return RawRequest(
        "POST", "/endpoints/mce-secure/invocations", "", (("authorization", token),), b"[1]"
    )


def test_bearer_key(authenticate) -> None:
    caller = authenticate(bearer(f"Bearer {API_KEY}"))
    assert (caller.principal, caller.scheme) == ("batch-job", "bearer")
    assert authenticate(bearer(f"bearer  {API_KEY} ")).principal == "batch-job"


def test_wrong_bearer_keys(authenticate) -> None:
    refused(
        authenticate,
        bearer(f"Bearer {API_KEY}x"),
        UnrecognizedClientError,
        "API key included in the request is invalid",
    )
    refused(
        authenticate, bearer(f"Bearer {SECRET_A}"), UnrecognizedClientError, "API key"
    )  # a SigV4 secret is not an API key
    refused(authenticate, bearer("Bearer "), MissingAuthenticationTokenError, "Bearer")


def test_errors_never_echo_secrets(authenticate) -> None:
    for request in (
        boto3_request(KEY_A, "wrong-secret-wrong-secret"),
        bearer("Bearer guessed-key-guessed-key"),
    ):
        with pytest.raises(ServingError) as raised:
            authenticate(request)
        text = str(raised.value.body())
        assert "wrong-secret" not in text and "guessed-key" not in text and SECRET_A not in text


# --- the identities file --------------------------------------------------------------------------


def test_identities_keep_secrets_out_of_reprs_and_references(identities: Identities) -> None:
    # What travels through Ray's registry is a reference to the file, never a secret or a digest of
    # one.
    text = repr(identities) + repr(identities.identities)
    assert SECRET_A not in text and API_KEY not in text
    reference = identities.reference()
    assert set(reference) == {"IdentitiesFile", "Fingerprint"}
    assert SECRET_A not in str(reference) and API_KEY not in str(reference)
    assert hashlib.sha256(API_KEY.encode()).hexdigest() not in str(reference)
    loaded = load_reference(reference)
    assert loaded.by_api_key(API_KEY).principal == "batch-job"
    assert loaded.by_access_key_id(KEY_A).secret_access_key == SECRET_A
    assert [p.name for p in loaded.by_access_key_id(KEY_B).policies] == ["all-but-special.json"]


def test_a_reference_refuses_a_file_changed_after_deploy(tmp_path: Path) -> None:
    policy = tmp_path / "policy.json"
    policy.write_text((ROOT / "policies" / "all-but-special.json").read_text())
    path = write_identities(
        tmp_path, [{"Principal": "p", "ApiKey": API_KEY, "PolicyDocuments": ["policy.json"]}]
    )
    reference = load_identities(path).reference()
    assert load_reference(reference).by_api_key(API_KEY) is not None
    # a policy changed
    policy.write_text((ROOT / "policies" / "customips-and-common.json").read_text())
    with pytest.raises(IdentitiesError, match="changed after the endpoint was deployed"):
        load_reference(reference)


def test_example_identities_file_loads() -> None:
    loaded = load_identities(ROOT / "examples" / "identities.yaml")
    assert [i.principal for i in loaded.identities] == ["team-a", "team-b", "batch-job"]
    assert [p.name for p in loaded.identities[0].policies] == ["customips-and-common.json"]


GOOD_POLICY = {"Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
SECRET = "s" * 20

INVALID_IDENTITIES = [
    (
        "no credentials",
        [{"Principal": "p", "PolicyDocuments": ["ok.json"]}],
        "Identities[0]: give AccessKeyId",
    ),
    (
        "key without secret",
        [{"Principal": "p", "AccessKeyId": KEY_A, "PolicyDocuments": ["ok.json"]}],
        "Identities[0]: AccessKeyId and SecretAccessKey go together",
    ),
    (
        "short secret",
        [
            {
                "Principal": "p",
                "AccessKeyId": KEY_A,
                "SecretAccessKey": "short",
                "PolicyDocuments": ["ok.json"],
            }
        ],
        "Identities[0].SecretAccessKey: must be at least 16 characters",
    ),
    (
        "short api key",
        [{"Principal": "p", "ApiKey": "abc", "PolicyDocuments": ["ok.json"]}],
        "Identities[0].ApiKey: must be at least 16",
    ),
    (
        "bad key id",
        [
            {
                "Principal": "p",
                "AccessKeyId": "AK",
                "SecretAccessKey": SECRET,
                "PolicyDocuments": ["ok.json"],
            }
        ],
        "Identities[0].AccessKeyId",
    ),
    (
        "key id with a trailing newline",
        [
            {
                "Principal": "p",
                "AccessKeyId": KEY_A + "\n",
                "SecretAccessKey": SECRET,
                "PolicyDocuments": ["ok.json"],
            }
        ],
        "Identities[0].AccessKeyId",
    ),
    (
        "principal with a trailing newline",
        [{"Principal": "p\n", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"]}],
        "Identities[0].Principal",
    ),
    (
        "principal with a space",
        [{"Principal": "p q", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"]}],
        "Identities[0].Principal",
    ),
    (
        "no policies",
        [{"Principal": "p", "ApiKey": SECRET, "PolicyDocuments": []}],
        "Identities[0].PolicyDocuments",
    ),
    (
        "unknown field",
        [{"Principal": "p", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"], "Role": "admin"}],
        "Identities[0].Role: unknown field",
    ),
    (
        "duplicate principal",
        [
            {"Principal": "p", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"]},
            {"Principal": "p", "ApiKey": SECRET + "2", "PolicyDocuments": ["ok.json"]},
        ],
        "Identities[1].Principal duplicates Identities[0]",
    ),
    (
        "duplicate api key",
        [
            {"Principal": "p", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"]},
            {"Principal": "q", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"]},
        ],
        "Identities[1].ApiKey duplicates Identities[0]",
    ),
    (
        "missing policy file",
        [{"Principal": "p", "ApiKey": SECRET, "PolicyDocuments": ["nope.json"]}],
        "Identities[0].PolicyDocuments[0] (nope.json): cannot read policy",
    ),
    (
        "bad policy",
        [{"Principal": "p", "ApiKey": SECRET, "PolicyDocuments": ["ok.json", "bad.json"]}],
        "Identities[0].PolicyDocuments[1] (bad.json): Statement[1].Effect: Input should be 'Allow' or 'Deny'",
    ),
]


@pytest.mark.parametrize(
    ("entries", "fragment"),
    [c[1:] for c in INVALID_IDENTITIES],
    ids=[c[0] for c in INVALID_IDENTITIES],
)
def test_invalid_identities_are_refused(tmp_path: Path, entries: list[dict], fragment: str) -> None:
    bad = {
        "Statement": [
            GOOD_POLICY["Statement"][0],
            {"Effect": "Permit", "Action": "*", "Resource": "*"},
        ]
    }
    path = write_identities(tmp_path, entries, {"ok.json": GOOD_POLICY, "bad.json": bad})
    with pytest.raises(IdentitiesError) as raised:
        load_identities(path)
    assert fragment in str(raised.value), str(raised.value)
    assert SECRET not in str(raised.value)


def test_identities_file_that_is_not_a_mapping(tmp_path: Path) -> None:
    (tmp_path / "identities.yaml").write_text("- just a list\n")
    with pytest.raises(IdentitiesError, match="must be a mapping"):
        load_identities(tmp_path / "identities.yaml")
    with pytest.raises(IdentitiesError, match="cannot read"):
        load_identities(tmp_path / "missing.yaml")


def test_loading_the_identities_module_costs_little_memory() -> None:
    # Every gateway, control plane, registry and container replica imports it: pydantic's default
    # regex engine compiled its two Unicode `\\w{..,128}` patterns into ~20 MiB per process. Each
    # of its dependencies is imported first; the module alone is measured, in a fresh interpreter.
    import subprocess
    import sys

    probe = (
        "import sys; sys.path.insert(0, sys.argv[1])\n"
        "import hashlib, hmac, yaml, pydantic, serving.access.policies, serving.documents\n"
        "def anonymous():\n"
        "    for line in open('/proc/self/smaps_rollup'):\n"
        "        if line.startswith('Anonymous:'): return int(line.split()[1]) / 1024\n"
        "before = anonymous()\n"
        "import serving.access.identities\n"
        "print(anonymous() - before)\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe, str(ROOT)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) < 4.0, f"{float(done.stdout):.1f} MiB"


def test_a_unicode_principal_is_still_accepted(tmp_path: Path) -> None:
    (tmp_path / "ok.json").write_text(json.dumps(GOOD_POLICY))
    (tmp_path / "identities.yaml").write_text(
        yaml.safe_dump(
            {
                "Identities": [
                    {"Principal": "élodie", "ApiKey": SECRET, "PolicyDocuments": ["ok.json"]}
                ]
            }
        )
    )
    assert [i.principal for i in load_identities(tmp_path / "identities.yaml").identities] == [
        "élodie"
    ]
