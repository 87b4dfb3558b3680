"""Reading endpoint specs for every command, and `serving validate`."""

from __future__ import annotations

import argparse
import sys

from serving.config.spec import EndpointSpec, SpecError, load_spec


def load_all(paths: list[str], identities: str | None = None) -> list[EndpointSpec]:
    """Every spec, or exit 2 after naming each one at fault (and EndpointNames used twice)."""
    specs, failed = [], False
    for path in paths:
        try:
            specs.append(load_spec(path, identities_file=identities))
        except SpecError as error:
            failed = True
            print(f"{path}: INVALID", file=sys.stderr)
            for line in str(error).splitlines():
                print(f"  {line}", file=sys.stderr)
    names = [spec.EndpointName for spec in specs]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        failed = True
        print(f"EndpointName used by more than one spec: {', '.join(duplicates)}", file=sys.stderr)
    if failed:
        raise SystemExit(2)
    return specs


def _access_summary(spec: EndpointSpec) -> str:
    if spec.AccessControl is None:
        return ""
    identities = spec.AccessControl.identities.identities
    return f"; AccessControl: {len(identities)} identities ({', '.join(i.principal for i in identities)})"


def cmd_validate(args: argparse.Namespace) -> int:
    for path, spec in zip(args.specs, load_all(args.specs, args.identities)):
        hostnames = ", ".join(c.ContainerHostname for c in spec.Containers)
        print(
            f"{path}: OK  endpoint {spec.EndpointName} ({spec.mode.value}, {len(spec.Containers)} containers: {hostnames}"
            f"{_access_summary(spec)})"
        )
    return 0


def add_parser(commands) -> None:
    """`serving validate`."""
    validate = commands.add_parser("validate", help="check endpoint specs and print the verdict")
    validate.add_argument("specs", nargs="+", metavar="SPEC")
    validate.add_argument(
        "--identities",
        metavar="FILE",
        help="identities file to use instead of each spec's AccessControl",
    )
    validate.set_defaults(func=cmd_validate)
