"""The text of each `serving loadtest` flag parsed: URLs, weights, load levels and payloads, every
mistake an `OptionError` naming the flag (the plan they make: `options`)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from urllib.parse import urlsplit

from serving import protocol
from serving.client import _core
from serving.protocol import NAME_PATTERN

__all__ = [
    "DEFAULT_PAYLOAD",
    "OptionError",
    "parse_baseline_url",
    "parse_endpoint_url",
    "parse_levels",
    "parse_payloads",
    "parse_weights",
]

DEFAULT_PAYLOAD = "[[5.1, 3.5, 1.4, 0.2]]"  # one iris row: what the demo endpoints take
_BY_SUFFIX = {
    ".json": protocol.JSON,
    ".csv": protocol.CSV,
    ".npy": protocol.NPY,
    ".txt": "text/plain",
}


class OptionError(ValueError):
    """A bad argument, with the flag it came from (shown as argparse shows its own errors)."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def parse_endpoint_url(url: str) -> tuple[str, str]:
    """(base URL, endpoint name) from `http://HOST:PORT[/prefix]/endpoints/NAME[/invocations]`."""
    parts = urlsplit(url)
    match = re.fullmatch(r"(.*?)/endpoints/([^/]+)(?:/invocations)?/?", parts.path)
    if parts.scheme not in ("http", "https") or not parts.netloc or not match:
        raise OptionError(
            "--endpoint", f"{url!r} is not an endpoint URL: use http://HOST:PORT/endpoints/NAME"
        )
    if not re.match(NAME_PATTERN, match.group(2)):
        raise OptionError("--endpoint", f"{match.group(2)!r} is not a valid endpoint name")
    return f"{parts.scheme}://{parts.netloc}{match.group(1)}", match.group(2)


def parse_baseline_url(url: str) -> tuple[str, str]:
    """(origin, path) of the baseline: its own path, or `/invocations` when it has none."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise OptionError(
            "--baseline", f"{url!r} is not a URL: use e.g. http://127.0.0.1:9000/invocations"
        )
    return f"{parts.scheme}://{parts.netloc}", parts.path.rstrip("/") or protocol.INVOCATIONS_PATH


def parse_weights(text: str) -> dict[str, float]:
    """`a=3,b=1` → {"a": 3.0, "b": 1.0}."""
    weights: dict[str, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, sep, value = item.partition("=")
        try:
            weight = float(value)
        except ValueError:
            weight = math.nan
        if not sep or not name or not math.isfinite(weight) or weight < 0:
            raise OptionError("--weights", f"{item!r}: use CONTAINER=WEIGHT, e.g. iris=3,wine=1")
        weights[name.strip()] = weight
    if not weights or sum(weights.values()) <= 0:
        raise OptionError("--weights", "give at least one positive weight, e.g. iris=3,wine=1")
    return weights


def parse_levels(text: str) -> list[float]:
    """`10,50,10` → [10.0, 50.0, 10.0]."""
    try:
        levels = [float(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise OptionError(
            "--steps", f"{text!r}: use comma-separated numbers, e.g. 10,50,10"
        ) from None
    if not levels or any(v < 0 or not math.isfinite(v) for v in levels) or max(levels) <= 0:
        raise OptionError("--steps", "steps must be non-negative numbers, at least one positive")
    return levels


def parse_payloads(
    payloads: list[str] | None, payload_json: str | None, content_type: str | None
) -> tuple[tuple[bytes, str], dict[str, tuple[bytes, str]]]:
    """(default body and content type, per-container ones) from --payload [CONTAINER=]FILE and
    --payload-json."""
    per_container: dict[str, tuple[bytes, str]] = {}
    default: tuple[bytes, str] | None = None
    for value in payloads or []:
        container, path = _split_payload(value)
        encoded = _encode_file(path, content_type)
        if container is None:
            if default is not None:
                raise OptionError(
                    "--payload", "give one default payload FILE; others as CONTAINER=FILE"
                )
            default = encoded
        else:
            per_container[container] = encoded
    if payload_json is not None:
        if default is not None:
            raise OptionError(
                "--payload-json", "give a default --payload FILE or --payload-json, not both"
            )
        default = _encode_json(payload_json, content_type)
    return default or _encode_json(DEFAULT_PAYLOAD, content_type), per_container


def _split_payload(value: str) -> tuple[str | None, Path]:
    name, sep, rest = value.partition("=")
    if sep and re.match(NAME_PATTERN, name) and not Path(value).is_file():
        return name, Path(rest)
    return None, Path(value)


def _encode_file(path: Path, content_type: str | None) -> tuple[bytes, str]:
    try:
        data = path.read_bytes()
    except OSError as error:
        raise OptionError("--payload", f"cannot read {path}: {error.strerror or error}") from None
    return _core.encode_payload(
        data, content_type or _BY_SUFFIX.get(path.suffix.lower(), protocol.OCTET_STREAM)
    )


def _encode_json(text: str, content_type: str | None) -> tuple[bytes, str]:
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError("--payload-json", f"not JSON: {error}") from None
    try:
        return _core.encode_payload(data, content_type)
    except (TypeError, ValueError) as error:
        raise OptionError("--content-type", str(error)) from None
