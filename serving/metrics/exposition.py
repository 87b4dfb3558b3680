"""`GET /metrics`: one Prometheus scrape for every container of every endpoint, on any node.

Two sources, merged by metric family (never by pasting texts together, which would repeat HELP and
TYPE lines and split one family in two):
- the gateway's own registry (`metrics`): the router's counters and latencies, exact and immediate;
- each Ray node's metrics agent, where Ray exports what replicas record (`replica_metrics`). Only
  the `ray_serving_*` families are kept, renamed to `serving_*`, and Ray's bookkeeping labels
  (worker, session, node, version) dropped; series that then coincide are summed.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Awaitable, Callable, Iterable

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

logger = logging.getLogger("serving.metrics")

RAY_PREFIX = "ray_"
SERVING_PREFIX = "serving_"
RAY_LABELS = frozenset(
    {
        "Component",
        "NodeAddress",
        "SessionName",
        "Version",
        "WorkerId",
        "JobId",
        "otel_scope_name",
        "otel_scope_schema_url",
        "otel_scope_version",
    }
)
NODE_LIST_TTL_S = 10.0
# The classic text format every Prometheus version reads (prometheus_client's "latest" moved to
# 1.0.0).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
EXACT_SUM_SUFFIX = "_exact_sum"  # see replica_metrics._Timing

_KEPT_LINES = (
    RAY_PREFIX + SERVING_PREFIX,
    f"# HELP {RAY_PREFIX}{SERVING_PREFIX}",
    f"# TYPE {RAY_PREFIX}{SERVING_PREFIX}",
)
_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')
_UNESCAPE = {"\\\\": "\\", '\\"': '"', "\\n": "\n"}


def serving_families_from_ray(text: str) -> list[Metric]:
    """The `serving_*` families of one node agent's exposition, Ray's labels and name prefix
    removed.

    Parsed here rather than by prometheus_client's parser, which takes ~50 us per line of Ray's long
    label sets (a gateway scraping dozens of replicas would spend a second per scrape); this reads
    the subset of the text format that Ray's exporter writes: HELP, TYPE, then that family's
    samples.
    """
    families: dict[str, Metric] = {}
    helps: dict[str, str] = {}
    family: Metric | None = None
    for line in text.splitlines():
        # hundreds of Ray's own series: skip before any parsing
        if not line.startswith(_KEPT_LINES):
            continue
        if line.startswith("# HELP "):
            name, _, documentation = line[7:].partition(" ")
            helps[name] = documentation.replace("\\n", "\n").replace("\\\\", "\\")
        elif line.startswith("# TYPE "):
            name, _, kind = line[7:].partition(" ")
            base = name[: -len("_total")] if kind == "counter" and name.endswith("_total") else name
            family = families.setdefault(
                base, Metric(base[len(RAY_PREFIX) :], helps.get(name, ""), kind.strip())
            )
        elif family is not None:
            match = _SAMPLE.fullmatch(line.strip())
            if match is None:
                continue
            sample_name, label_text, value = match.groups()
            if not sample_name.startswith(RAY_PREFIX + family.name):
                continue
            labels = {
                key: _unescape(raw)
                for key, raw in _LABEL.findall(label_text or "")
                if key not in RAY_LABELS
            }
            family.add_sample(sample_name[len(RAY_PREFIX) :], labels, float(value))
    return _with_exact_sums({metric.name: metric for metric in families.values()})


def _unescape(value: str) -> str:
    return re.sub(r"\\[\\\"n]", lambda m: _UNESCAPE[m.group(0)], value) if "\\" in value else value


def _with_exact_sums(families: dict[str, Metric]) -> list[Metric]:
    """Histograms with their `_sum` taken from the exact-sum counter recorded next to them."""
    for name in [name for name in families if name.endswith(EXACT_SUM_SUFFIX)]:
        exact = families.pop(name)
        histogram = families.get(name[: -len(EXACT_SUM_SUFFIX)])
        if histogram is None or histogram.type != "histogram":
            continue
        sums = {
            _key(sample.labels): sample.value
            for sample in exact.samples
            if sample.name.endswith("_total")
        }
        histogram.samples = [
            sample._replace(value=sums.get(_key(sample.labels), 0.0))
            if sample.name == histogram.name + "_sum"
            else sample
            for sample in histogram.samples
        ]
    return list(families.values())


def _key(labels: dict[str, str]) -> tuple:
    return tuple(sorted(labels.items()))


def merge_families(families: Iterable[Metric]) -> list[Metric]:
    """One family per name, series with equal labels summed (counts and buckets add up across
    processes).

    `_created` samples are left out: Ray's series have none, and a merged series has no single
    creation.
    """
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple, float]] = {}
    for family in families:
        target = merged.get(family.name)
        if target is None:
            target = merged[family.name] = Metric(
                family.name, family.documentation, family.type, family.unit
            )
            values[family.name] = {}
        elif target.type != family.type:
            logger.warning(
                "metric %s has types %s and %s; keeping the first",
                family.name,
                target.type,
                family.type,
            )
            continue
        series = values[family.name]
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            key = (sample.name, _key(sample.labels))
            series[key] = series.get(key, 0.0) + sample.value
    for name, family in merged.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return [merged[name] for name in sorted(merged)]


class _Families:
    """The collector interface `generate_latest` expects, over a fixed list of families."""

    def __init__(self, families: list[Metric]) -> None:
        self._families = families

    def collect(self) -> list[Metric]:
        return self._families


def exposition(families: Iterable[Metric]) -> bytes:
    """Prometheus text format of the merged families."""
    return generate_latest(_Families(merge_families(families)))


class MetricsRoute:
    """The cluster's `GET /metrics`: the collectors given, every Ray node's replica metrics, and the
    gateways' published counters (`peers`), merged. It runs in the control plane, which every
    gateway's `/metrics` asks with that gateway's own current counters (`scrape(local, skip=...)`);
    `routes` serves it directly.

    A Ray node's agent takes 0.3-0.7 s to write its exposition (1.3 MB for ~25 replicas, measured;
    more under load), so a scrape does not wait on it for long: each scrape starts a refresh of the
    nodes' families (unless one is running or the last is under `max_age_s` old) and waits up to
    `wait_s` for it, then answers with the freshest families it has. Replicas only push every few
    seconds anyway.
    """

    def __init__(
        self,
        collectors: Iterable,
        node_urls: Callable[[], Awaitable[list[str]]],
        peers: Callable[[], Awaitable[dict[str, str]]] | None = None,
        *,
        timeout_s: float = 10.0,
        wait_s: float = 1.5,
        max_age_s: float = 1.0,
    ) -> None:
        self.collectors = list(collectors)  # anything with collect()
        self._node_urls = node_urls  # the metrics export URL of every live Ray node
        self._peers = peers  # each gateway's published counters (Prometheus text), by gateway
        self._peer_parsed: dict[str, tuple[str, list[Metric]]] = {}  # gateway -> (text, families)
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._wait_s, self._max_age_s = wait_s, max_age_s
        self._nodes: tuple[float, list[str]] = (float("-inf"), [])
        self._session: aiohttp.ClientSession | None = None
        # url -> its families at the last good read
        self._node_families: dict[str, list[Metric]] = {}
        self._refreshed_at = float("-inf")
        self._refresh: asyncio.Task | None = None

    def routes(self) -> list[Route]:
        return [Route("/metrics", self.metrics, methods=["GET"])]

    async def metrics(self, request: Request) -> Response:
        return Response(await self.scrape(), media_type=CONTENT_TYPE)

    async def scrape(self, local: bytes = b"", skip: str | None = None) -> bytes:
        """The merged exposition, with `local` (a gateway's own current counters, Prometheus text)
        in place of what the gateway `skip` last published."""
        await self._fresh()
        return await asyncio.to_thread(lambda: exposition(self._families(local, skip)))

    async def merged(self, nodes: bool = True) -> list[Metric]:
        """Every family, merged as a scrape merges them (what the control plane samples for
        CloudWatch); without `nodes`, only the gateways' (read from the GCS, which costs no node's
        metrics agent an exposition)."""
        if nodes:
            await self._fresh()
            return await asyncio.to_thread(lambda: merge_families(self._families(b"", None)))
        await self._refresh_peers()
        return await asyncio.to_thread(
            lambda: merge_families(self._families(b"", None, nodes=False))
        )

    async def _fresh(self) -> None:
        """Start a refresh of the nodes' families unless one runs or the last is recent; wait for
        it, bounded."""
        if self._refresh is None and time.monotonic() - self._refreshed_at > self._max_age_s:
            self._refresh = asyncio.create_task(self._refresh_nodes())
        if self._refresh is not None:
            await asyncio.wait({self._refresh}, timeout=self._wait_s)

    def _families(self, local: bytes, skip: str | None, nodes: bool = True) -> list[Metric]:
        families = [family for collector in self.collectors for family in collector.collect()]
        for node in list(self._node_families.values()) if nodes else []:
            families.extend(node)
        for gateway, published in list(self._peer_families.items()):
            if gateway != skip:
                families.extend(published)
        families.extend(text_string_to_metric_families(local.decode()))
        return families

    async def _refresh_nodes(self) -> None:
        try:
            urls = await self._urls()
            texts = await asyncio.gather(*(self._fetch(url) for url in urls))
            # Parsing takes milliseconds per node: off the event loop that serves invocations.
            parsed = await asyncio.to_thread(
                lambda: {
                    url: serving_families_from_ray(text)
                    for url, text in zip(urls, texts)
                    if text is not None
                }
            )
            # A node that did not answer keeps its last families; one that left the cluster loses
            # them.
            self._node_families = {
                url: parsed.get(url, self._node_families.get(url, [])) for url in urls
            }
            await self._refresh_peers()
            self._refreshed_at = time.monotonic()
        except Exception:
            logger.exception("refreshing the nodes' metrics failed")
        finally:
            self._refresh = None

    async def _refresh_peers(self) -> None:
        """Read the gateways' published counters; a text unchanged since the last read (an idle
        gateway's) keeps its parsed families instead of being parsed again."""
        if self._peers is not None:
            peer_texts = await self._peers()
            known = self._peer_parsed
            self._peer_parsed = await asyncio.to_thread(
                lambda: {
                    gateway: known[gateway]
                    if gateway in known and known[gateway][0] == text
                    else (text, list(text_string_to_metric_families(text)))
                    for gateway, text in peer_texts.items()
                }
            )

    @property
    def _peer_families(self) -> dict[str, list[Metric]]:
        """Each gateway's last published families."""
        return {gateway: families for gateway, (_, families) in self._peer_parsed.items()}

    async def _urls(self) -> list[str]:
        fetched_at, urls = self._nodes
        if time.monotonic() - fetched_at > NODE_LIST_TTL_S:
            try:
                urls = await self._node_urls()
                self._nodes = (time.monotonic(), urls)
            except Exception:
                logger.exception("could not list the Ray nodes' metrics ports; using the last list")
        return urls

    async def _fetch(self, url: str) -> str | None:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            async with self._session.get(url) as response:
                response.raise_for_status()
                return await response.text()
        except Exception as error:  # a node going away must not fail the whole scrape
            logger.warning("metrics of %s not read: %s", url, error)
            return None

    async def close(self) -> None:
        if self._refresh is not None:
            self._refresh.cancel()
        if self._session is not None:
            await self._session.close()
