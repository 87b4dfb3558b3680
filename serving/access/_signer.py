"""botocore's Signature V4 signer, as the verifier uses it: the signature a request should carry.

Kept apart from `sigv4` so that importing the authenticator's types (and loading identities or a
spec) never imports botocore; `sigv4.Authenticator` imports this module when it is made.
"""

from __future__ import annotations

from collections.abc import Sequence

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.compat import HTTPHeaders
from botocore.credentials import Credentials


class _Verifier(SigV4Auth):
    """botocore's signer, told to use exactly the headers the caller listed in SignedHeaders."""

    def __init__(
        self, credentials: Credentials, service: str, region: str, signed: Sequence[str]
    ) -> None:
        super().__init__(credentials, service, region)
        self._signed = frozenset(signed)

    def headers_to_sign(self, request: AWSRequest) -> HTTPHeaders:
        headers = HTTPHeaders()
        for name, value in request.headers.items():
            if name.lower() in self._signed:
                headers[name.lower()] = value
        return headers


def expected_signature(
    method: str,
    path: str,
    query: str,
    headers: Sequence[tuple[str, str]],
    body: bytes,
    *,
    access_key_id: str,
    secret_access_key: str,
    service: str,
    region: str,
    signed: Sequence[str],
    amz_date: str,
) -> str:
    """The signature of a request as it arrived (raw path and query, headers in order), signed at
    `amz_date`."""
    # Only the path and query of the URL enter the canonical request; the scheme is http so that
    # botocore hashes the payload (it always signs payloads over plain HTTP, as boto3 does).
    url = f"http://signed.invalid{path}" + (f"?{query}" if query else "")
    aws_request = AWSRequest(method=method, url=url, data=body)
    for name, value in headers:
        if name.lower() in signed:
            aws_request.headers[name] = value  # HTTPHeaders appends: repeated headers are kept
    aws_request.context["timestamp"] = amz_date
    verifier = _Verifier(Credentials(access_key_id, secret_access_key), service, region, signed)
    canonical = verifier.canonical_request(aws_request)
    return verifier.signature(verifier.string_to_sign(aws_request, canonical), aws_request)
