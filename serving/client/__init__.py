"""Python SDK of a serving endpoint server: `Client` (blocking) and `AsyncClient` (asyncio).

    from serving.client import Client
    client = Client("http://127.0.0.1:8080")
    print(client.invoke("mce-demo", [[5.1, 3.5, 1.4, 0.2]], target="iris").body)

See docs/client.md.

Modules: `_core` (what both clients share, no I/O), `_flows` (each call written once, as steps),
`_clients` (`Client`, `AsyncClient`: the steps driven),
`credentials` (SigV4 or a bearer key), `exceptions` (one per error code, under one base),
`replies` (the answers' types).
"""

from serving.client._clients import AsyncClient, Client
from serving.client._core import InvokeResult, RetryPolicy
from serving.client.exceptions import (
    AccessDenied,
    ConnectionFailed,
    InternalFailure,
    InvalidSignature,
    MissingAuthenticationToken,
    ModelError,
    ModelNotReady,
    ServiceUnavailable,
    ServingClientError,
    UnknownOperation,
    UnknownServerError,
    UnrecognizedClient,
    ValidationError,
    WaiterError,
)

__all__ = [
    "AccessDenied",
    "AsyncClient",
    "Client",
    "ConnectionFailed",
    "InternalFailure",
    "InvalidSignature",
    "InvokeResult",
    "MissingAuthenticationToken",
    "ModelError",
    "ModelNotReady",
    "RetryPolicy",
    "ServiceUnavailable",
    "ServingClientError",
    "UnknownOperation",
    "UnknownServerError",
    "UnrecognizedClient",
    "ValidationError",
    "WaiterError",
]
