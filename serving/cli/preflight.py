"""What `serving up` and `serving server` refuse, or warn of, before Ray starts: checks of specs
against settings."""

from __future__ import annotations

import sys

from serving.config.spec import EndpointSpec, SpecError
from serving.settings import ServerSettings, is_loopback

__all__ = ["check_anonymous", "check_container_network", "check_requirements"]


def check_anonymous(specs: list[EndpointSpec], host: str, allow_anonymous: bool) -> str | None:
    """The warning to print about endpoints without AccessControl; raises SystemExit(2) if they may
    not be served."""
    anonymous = [spec.EndpointName for spec in specs if spec.AccessControl is None]
    if not anonymous:
        return None
    names = ", ".join(anonymous)
    if not is_loopback(host) and not allow_anonymous:
        print(
            f"refusing to serve {names} without authentication on {host}, which is not a loopback address: "
            "add AccessControl to the spec (or --identities FILE; see docs/security.md), "
            "or pass --allow-anonymous to serve it to anyone who can reach the port",
            file=sys.stderr,
        )
        raise SystemExit(2)
    who = (
        "anyone who can reach this machine" if is_loopback(host) else f"ANYONE who can reach {host}"
    )
    bar = "!" * 78
    return (
        f"{bar}\n!! WARNING: no authentication for {names}: {who} can invoke every container.\n"
        f"!! Add AccessControl (docs/security.md) before exposing the server.\n{bar}"
    )


def check_requirements(specs: list[EndpointSpec], allowed: bool) -> str | None:
    """Why a spec's model requirements may not be installed (`control.runtime_env`), before Ray
    starts; None if they may."""
    from serving.control.runtime_env import ray_runtime_env

    for spec in specs:
        for container in spec.Containers:
            try:
                ray_runtime_env(container, allowed)
            except SpecError as error:
                return f"{spec.EndpointName}: {error}"
    return None


def check_container_network(specs: list[EndpointSpec], settings: ServerSettings) -> str | None:
    """Why the containers cannot be walled off as the settings say (before Ray starts); None if they
    can."""
    from serving.control.plans import egress_ports
    from serving.errors import ValidationError

    for spec in specs:
        for container in spec.Containers:
            try:
                egress_ports(container, settings)
            except ValidationError as error:
                return f"{spec.EndpointName}: {error}"
    if settings.sandbox == "off" or settings.shared_container_network:
        return None
    from serving.model_server.netns import unavailable

    why = unavailable()
    if why is None:
        return None
    return (
        f"container processes cannot have a network namespace of their own here ({why}), and without one tenant "
        "code shares the gateways' network. Run as root, allow unprivileged user namespaces, or accept narrower "
        "walls with --shared-container-network (docs/security.md)"
    )
