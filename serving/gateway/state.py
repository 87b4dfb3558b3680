"""The gateway's view of the control plane, without Ray: a registry snapshot in, the request path's
tables out.

The Ray gateway polls the registry and hands each new snapshot to `GatewayState.apply`, which swaps
in, together: the status board's records and descriptions (as anyone may read them:
`public_descriptions`), the transport's replica lists (with each container's in-flight limit and
whether its requests may be retried), each endpoint's access control (identities files read here,
once per file and fingerprint; the registry only names them) and the pipeline's endpoint table.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from serving.access.decision import EndpointAccess
from serving.access.identities import Identities
from serving.config.async_inference import AsyncInferenceConfig
from serving.config.data_capture import DataCaptureConfig
from serving.control.records import Snapshot
from serving.control.status import EndpointRecord, StatusBoard
from serving.gateway.admission import EndpointRoute
from serving.gateway.invocation import Invocations
from serving.gateway.public_descriptions import public_description
from serving.gateway.transport import ContainerTransport
from serving.gateway.variants import Front, ShadowRoute, VariantRoute
from serving.settings import ServerSettings

logger = logging.getLogger("serving.gateway.state")


class GatewayState:
    """Holds what the gateway routes with and replaces it from registry snapshots."""

    def __init__(
        self,
        settings: ServerSettings,
        invocations: Invocations,
        transport: ContainerTransport,
        board: StatusBoard,
    ) -> None:
        self.settings = settings
        self.invocations, self.transport, self.board = invocations, transport, board
        self.access: dict[str, EndpointAccess] = {}
        # (file, fingerprint) -> access, loaded once
        self._identities: dict[tuple[str, str], EndpointAccess] = {}
        self.version, self.known = -1, 0
        self.epoch: str | None = None  # the registry process whose versions `version` counts
        invocations.loaded = False  # until the first snapshot: 503, which clients retry

    def offer(self, snapshot: Snapshot | None) -> bool:
        """Apply a registry snapshot (None: nothing changed) unless it must not be believed; True if
        applied.

        A registry that comes back with a new epoch knowing no endpoint while this gateway routes
        some has lost its store: emptying the table would turn every request away, so the gateway
        keeps what it has.
        """
        if snapshot is None:
            return False
        if snapshot["epoch"] != self.epoch and self.known and not snapshot["endpoints"]:
            logger.error(
                "a new registry knows no endpoint; keeping the %d this gateway routes to",
                self.known,
            )
            return False
        self.version, self.epoch, self.known = (
            snapshot["version"],
            snapshot["epoch"],
            len(snapshot["endpoints"]),
        )
        self.apply(snapshot)
        return True

    def apply(self, snapshot: Snapshot) -> None:
        """Swap in the registry's view: descriptions, replica lists, access, the endpoint table."""
        self.board.read(snapshot)
        # GET /endpoints/{name} and failed invocations show them to any caller: no path of this
        # machine in them
        self.board.descriptions = {
            name: public_description(d) for name, d in self.board.descriptions.items()
        }
        records = self.board.records
        api = snapshot["api"]
        shadows = api.get("shadows", {}) if api is not None else {}
        self.invocations.fronts = {
            public: Front(
                public,
                tuple(VariantRoute(*variant) for variant in variants),
                tuple(ShadowRoute(*shadow) for shadow in shadows.get(public, ())),
            )
            for public, variants in (api["fronts"] if api is not None else {}).items()
        }
        limits = {
            (name, host): limit
            for name, record in records.items()
            for host, limit in record.limits.items()
        }
        once = {(name, host) for name, record in records.items() for host in record.not_idempotent}
        self.transport.update(snapshot["replicas"], limits, once)
        self.access = self._access_of(records)
        self.invocations.endpoints = {
            name: EndpointRoute(
                name,
                record.mode,
                tuple(c["ContainerHostname"] for c in record.containers),
                failure=self.board.failure(name),
                access=self.access.get(name),
                multi_model=frozenset(
                    c["ContainerHostname"] for c in record.containers if c["Mode"] == "MultiModel"
                ),
                async_inference=_async_config(name, record.async_inference),
                data_capture=_capture_config(name, record.data_capture),
            )
            for name, record in records.items()
        }
        self.invocations.loaded = True

    def desired_replicas(self) -> dict[tuple[str, str], int]:
        """Each container's desired count: its autoscaler's last decision, else the count it was
        deployed with."""
        return {
            (name, c["ContainerHostname"]): (
                scaling["DesiredReplicas"]
                if (scaling := record.scaling.get(c["ContainerHostname"]))
                else c["DesiredReplicas"]
            )
            for name, record in self.board.records.items()
            for c in record.containers
        }

    def replica_counts(self) -> dict[tuple[str, str], int]:
        """Each routed container's registered replicas, as the transport holds them."""
        return {
            (name, container): self.transport.replica_count(name, container)
            for name, route in self.invocations.endpoints.items()
            for container in route.containers
        }

    def _access_of(self, records: Mapping[str, EndpointRecord]) -> dict[str, EndpointAccess]:
        """Access control of each endpoint that has it, loaded once per identities file and
        fingerprint.

        A file that cannot be loaded here (it was validated at deploy) refuses every call of its
        endpoints rather than serve them openly.
        """
        access: dict[str, EndpointAccess] = {}
        loaded: dict[tuple[str, str], EndpointAccess | None] = {}
        for name, record in records.items():
            if record.access is None:
                continue
            reference = (record.access["IdentitiesFile"], record.access["Fingerprint"])
            if reference not in loaded:
                loaded[reference] = self._identities.get(reference)
            current = loaded[reference]
            if current is None:
                try:
                    current = EndpointAccess.from_reference(
                        record.access,
                        region=self.settings.region,
                        account_id=self.settings.account_id,
                    )
                except Exception as error:
                    logger.error(
                        "access control of endpoint %s could not be loaded on the gateway; refusing its calls: %s",
                        name,
                        error,
                    )
                    current = EndpointAccess(  # no identities: nobody authenticates
                        Identities([]),
                        region=self.settings.region,
                        account_id=self.settings.account_id,
                    )
                loaded[reference] = current
            access[name] = current
        self._identities = {
            key: value
            for key, value in loaded.items()
            if value is not None and value.identities.identities
        }
        return access


def _capture_config(name: str, document: Mapping[str, Any] | None) -> DataCaptureConfig | None:
    """The endpoint's DataCaptureConfig (validated at deploy) while capture is on; one that no
    longer validates captures nothing (the invocations are served as always)."""
    if document is None:
        return None
    try:
        config = DataCaptureConfig.model_validate(document)
    except ValueError as error:  # pydantic.ValidationError is one
        logger.error(
            "DataCaptureConfig of endpoint %s is not valid on the gateway; capturing nothing: %s",
            name,
            error,
        )
        return None
    return config if config.EnableCapture and config.InitialSamplingPercentage > 0 else None


def _async_config(name: str, document: Mapping[str, Any] | None) -> AsyncInferenceConfig | None:
    """The endpoint's AsyncInferenceConfig (validated at deploy); one that no longer validates
    serves no async call."""
    if document is None:
        return None
    try:
        return AsyncInferenceConfig.model_validate(document)
    except ValueError as error:
        logger.error(
            "AsyncInferenceConfig of endpoint %s is not valid on the gateway; serving no async call: %s",
            name,
            error,
        )
        return None
