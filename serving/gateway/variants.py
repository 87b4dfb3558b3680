"""Production variants of the endpoints the control-plane API creates: which variant runs an
invocation, and which shadow variant gets a copy of it.

An API endpoint (`Front`) has one or more variants, each served by an endpoint of its own; an
invocation goes to the variant its `X-Amzn-SageMaker-Target-Variant` names, else to one drawn with
probability weight / total weight, as SageMaker splits traffic by `CurrentWeight`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from serving import protocol
from serving.errors import ValidationError

__all__ = ["Front", "ShadowRoute", "VariantRoute"]


@dataclass(frozen=True)
class VariantRoute:
    """One production variant of an API endpoint: its name, the endpoint that serves it, its
    weight."""

    name: str
    endpoint: str
    weight: float


@dataclass(frozen=True)
class ShadowRoute:
    """A shadow variant: a copy of `share` of the endpoint's invocations goes to the endpoint that
    serves it."""

    name: str
    endpoint: str
    share: float


@dataclass(frozen=True)
class Front:
    """An endpoint created through the control-plane API: invocations are split over its variants by
    weight, and a sample of them is copied to its shadow variants."""

    name: str
    variants: tuple[VariantRoute, ...]
    shadows: tuple[ShadowRoute, ...] = ()

    def shadow(self, draw: Callable[[], float] = random.random) -> ShadowRoute | None:
        """The shadow variant this invocation is copied to, if it is sampled (SageMaker allows
        one)."""
        for shadow in self.shadows:
            if draw() < shadow.share:
                return shadow
        return None

    def pick(
        self, requested: str | None, draw: Callable[[], float] = random.random
    ) -> VariantRoute:
        """The variant `requested` (TargetVariant), else one drawn by weight; ValidationError if
        none can be."""
        if requested is not None:
            named = [variant for variant in self.variants if variant.name == requested]
            if not named:
                names = ", ".join(dict.fromkeys(variant.name for variant in self.variants))
                raise ValidationError(
                    f"{protocol.TARGET_VARIANT} {requested!r} names no variant of endpoint {self.name}; variants: {names}"
                )
            # While an update shifts traffic, a variant is served by two fleets: split by their
            # weights.
            return _weighted(named, draw) or named[0]
        chosen = _weighted(list(self.variants), draw)
        if chosen is None:
            raise ValidationError(
                f"every variant of endpoint {self.name} has weight 0: name one with {protocol.TARGET_VARIANT}"
            )
        return chosen


def _weighted(variants: list[VariantRoute], draw: Callable[[], float]) -> VariantRoute | None:
    """One of `variants` drawn with probability weight / total weight (None if every weight is
    0)."""
    total = sum(variant.weight for variant in variants)
    if total <= 0:
        return None
    if len(variants) == 1:
        return variants[0]
    point, running = draw() * total, 0.0
    for variant in variants:
        running += variant.weight
        if point < running and variant.weight > 0:
            return variant
    return next(variant for variant in reversed(variants) if variant.weight > 0)
