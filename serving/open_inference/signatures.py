"""What each container's model takes and answers, read once per gateway from one of its replicas.

A container process answers `GET /_serving/signature` (signed like every hop) with its model's
tensors and the content types that carry one tensor to it and back (`Runtime.tensor_signature`). The
gateway keeps each answer while the container's replicas stay the same ones: a redeployed container
has new replicas, so a new reading.
"""

from __future__ import annotations

import json
from typing import cast

from serving import protocol
from serving.errors import ModelError
from serving.gateway.transport import ContainerTransport
from serving.runtimes.tensor_metadata import TensorSignature

READ_TIMEOUT_S = 10.0


class Signatures:
    def __init__(self, transport: ContainerTransport) -> None:
        self.transport = transport
        self._known: dict[tuple[str, str], tuple[tuple[str, ...], TensorSignature]] = {}

    async def get(self, endpoint: str, container: str) -> TensorSignature:
        """The container's signature: `inputs`, `outputs`, `content_type`, `accept` (and
        `platform`)."""
        key = (endpoint, container)
        replicas = self.transport.replica_urls(endpoint, container)
        known = self._known.get(key)
        if known is not None and known[0] == replicas:
            return known[1]
        answer = await self.transport.read(
            endpoint, container, protocol.SIGNATURE_PATH, READ_TIMEOUT_S
        )
        try:
            signature = json.loads(answer.body) if answer.status == 200 else None
        except ValueError:
            signature = None
        if not isinstance(signature, dict) or not {
            "inputs",
            "outputs",
            "content_type",
            "accept",
        } <= set(signature):
            raise ModelError(
                f"container {container} did not say what its model takes (status {answer.status})",
                container=container,
                original_status=answer.status,
                original_message=answer.body[:200].decode("utf-8", "replace"),
            )
        # its keys are the signature's (its tensors: the container's)
        checked = cast(TensorSignature, signature)
        self._known[key] = (replicas, checked)
        return checked
