"""Bounded channels between stages, with policy-version (staleness) accounting.

A producer stage (the rollout) puts items tagged with the policy version that made
them; a consumer stage (the actor) takes them at its own version. The difference is the
item's staleness: how many updates the policy has taken since the data was generated.
The channel refuses to hold more than ``capacity`` items (a producer that runs ahead
is a bug in the schedule, not something to buffer silently) and refuses to hand out an
item staler than ``max_staleness``, so off-policy lag is bounded by construction.

The host drives every stage from one thread and JAX's async dispatch overlaps them on
the devices, so a channel holds *futures*: device arrays that may still be computing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any


class ChannelFull(RuntimeError):
    """A producer put into a channel already holding ``capacity`` items."""


class ChannelEmpty(RuntimeError):
    """A consumer took from an empty channel."""


class TooStale(RuntimeError):
    """An item lags the consumer by more policy versions than ``max_staleness`` allows."""


@dataclass
class ChannelStats:
    puts: int = 0
    gets: int = 0
    max_occupancy: int = 0
    staleness_sum: int = 0
    max_staleness_seen: int = 0

    @property
    def mean_staleness(self) -> float:
        return self.staleness_sum / self.gets if self.gets else 0.0


@dataclass
class Channel:
    name: str
    capacity: int = 1
    max_staleness: int = 0
    _items: deque = field(default_factory=deque, repr=False)
    stats: ChannelStats = field(default_factory=ChannelStats)

    def __post_init__(self):
        if self.capacity < 1:
            raise ValueError(f"channel {self.name}: capacity must be >= 1, got {self.capacity}")
        if self.max_staleness < 0:
            raise ValueError(f"channel {self.name}: max_staleness must be >= 0, got {self.max_staleness}")

    def __len__(self) -> int:
        return len(self._items)

    @property
    def full(self) -> bool:
        return len(self._items) >= self.capacity

    def put(self, item: Any, version: int) -> None:
        if self.full:
            raise ChannelFull(f"channel {self.name} already holds {self.capacity} item(s)")
        self._items.append((version, item))
        self.stats.puts += 1
        self.stats.max_occupancy = max(self.stats.max_occupancy, len(self._items))

    def get(self, consumer_version: int) -> tuple[Any, int]:
        """Returns ``(item, staleness)`` of the oldest item."""
        if not self._items:
            raise ChannelEmpty(f"channel {self.name} is empty")
        version, item = self._items[0]
        staleness = consumer_version - version
        if staleness < 0:
            raise ValueError(f"channel {self.name}: item from version {version} is newer than its consumer ({consumer_version})")
        if staleness > self.max_staleness:
            raise TooStale(
                f"channel {self.name}: item from policy version {version} is {staleness} version(s) behind "
                f"its consumer; max_staleness={self.max_staleness}"
            )
        self._items.popleft()
        self.stats.gets += 1
        self.stats.staleness_sum += staleness
        self.stats.max_staleness_seen = max(self.stats.max_staleness_seen, staleness)
        return item, staleness

    def clear(self) -> None:
        self._items.clear()
