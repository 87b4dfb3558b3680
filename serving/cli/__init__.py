"""The `serving` command: validate specs, bring endpoints up on an embedded or existing Ray, and
load-test them.

One module per command group: `specs` (reading specs; `serving validate`), `up` (`serving up`),
`up_arguments` (its flags), `preflight` (what `serving up` refuses before Ray starts), `apply`
(`serving apply` / `serving delete` against a running server), `loadtest` (`serving loadtest`),
`train` (`serving train`). Nothing here imports Ray until a command needs it (`serving.ray_wing`,
only once specs and settings are known to be good).
"""

from __future__ import annotations

import argparse

from serving.cli import apply, loadtest, specs, train, up_arguments
from serving.cli.preflight import check_anonymous
from serving.cli.up import example_calls

__all__ = ["build_parser", "check_anonymous", "example_calls", "main"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="serving", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    specs.add_parser(commands)
    up_arguments.add_parser(commands)
    apply.add_parsers(commands)
    loadtest.add_parser(commands)
    train.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
