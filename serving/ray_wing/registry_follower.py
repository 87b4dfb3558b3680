"""How a gateway reads the registry's next snapshot: the snapshot feed when the registry has one
(`control.snapshot_feed`: a plain HTTP long poll, a fraction of a Ray call's cost to the registry),
else a Ray call to `Registry.snapshot`, as before the feed.

The feed is only a faster way to the same snapshots: a gateway that cannot reach it (a firewall
between nodes, a registry restarting on a new port, the feed's connection cap reached, an answer
that fails its signature) says so once and long-polls through Ray for `FEED_RETRY_S`, then tries the
feed its latest snapshot names again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any
from urllib.parse import urlsplit

from serving.control import snapshot_feed
from serving.control.records import Snapshot
from serving.gateway.hop_client import HopClient, HopLost, HopRefused
from serving.metrics.invocations import REGISTRY_POLLS
from serving.trust import keys

logger = logging.getLogger("serving.ray_wing.registry_follower")

FEED_RETRY_S = 30.0  # after the feed failed, Ray's long poll for this long
FEED_GRACE_S = 10.0  # a feed's answer may take this much longer than the wait asked for


class FeedUnusable(Exception):
    """The feed did not answer with a snapshot or "no change" this time."""


class RegistryFollower:
    """One gateway's long poll of the registry (its own connection to the feed)."""

    def __init__(self, registry: Any, reader: str, root: bytes) -> None:
        self.registry, self.reader = registry, reader
        self._key = keys.feed_key(root)
        self._client = HopClient()
        self.feed: str | None = None  # the feed's URL, as the latest snapshot names it
        self._feed_off_until = 0.0
        self.via_feed = 0  # answers read from the feed (tests and benchmarks tell the paths apart)

    async def next(self, since: int, epoch: str | None, wait_s: float) -> Snapshot | None:
        """The registry's snapshot once it moves past version `since` of `epoch`, or None when it
        did not within `wait_s`."""
        if self.feed is not None and time.monotonic() >= self._feed_off_until:
            try:
                snapshot = await self._from_feed(self.feed, since, epoch, wait_s)
            except FeedUnusable as error:
                REGISTRY_POLLS.labels("feed_failed").inc()
                logger.warning(
                    "the registry's snapshot feed %s failed (%s): long-polling through Ray for %.0f s",
                    self.feed,
                    error,
                    FEED_RETRY_S,
                )
                self._feed_off_until = time.monotonic() + FEED_RETRY_S
            else:
                REGISTRY_POLLS.labels("feed").inc()
                self.via_feed += 1
                self.learn(snapshot)
                return snapshot
        REGISTRY_POLLS.labels("ray").inc()
        call = self.registry.snapshot.remote(since, wait_s, epoch, self.reader)
        snapshot = await asyncio.wrap_future(call.future())
        self.learn(snapshot)
        return snapshot

    def learn(self, snapshot: Snapshot | None) -> None:
        """Note the feed a snapshot names, however it was read."""
        if snapshot is None:
            return
        feed = snapshot.get("feed")
        if feed != self.feed:  # a new feed (a restarted registry): worth trying at once
            self.feed, self._feed_off_until = feed, 0.0

    async def _from_feed(
        self, url: str, since: int, epoch: str | None, wait_s: float
    ) -> Snapshot | None:
        parts = urlsplit(url)
        if parts.hostname is None or parts.port is None:
            raise FeedUnusable(f"not a feed address: {url!r}")
        headers = snapshot_feed.ask(self._key, self.reader, since, epoch, wait_s)
        try:
            answer = await self._client.post(
                parts.hostname,
                parts.port,
                snapshot_feed.FEED_PATH,
                b"",
                headers,
                min(wait_s, snapshot_feed.MAX_WAIT_S) + FEED_GRACE_S,
            )
        except HopRefused:
            raise FeedUnusable("connection refused") from None
        except (HopLost, OSError):  # reset, closed, or not HTTP
            raise FeedUnusable("the connection broke") from None
        except TimeoutError:
            raise FeedUnusable("no answer in time") from None
        if answer.status == 204:
            return None
        if answer.status != 200:
            raise FeedUnusable(f"it answered {answer.status}")
        try:
            return snapshot_feed.open_answer(
                self._key, answer.body, answer.headers.get(snapshot_feed.SIGNATURE_HEADER)
            )
        except snapshot_feed.FeedAnswerRefused as error:
            raise FeedUnusable(str(error)) from None

    def close(self) -> None:
        self._client.close()
