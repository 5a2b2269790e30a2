"""Counters that add up across peers with Group.all_reduce."""

import math
import time
from collections import defaultdict


class Stats:
    """Sums and counts by name. Means are sum / count; two Stats add key by key."""

    def __init__(self, sums=None, counts=None):
        self.sums = defaultdict(float, sums or {})
        self.counts = defaultdict(int, counts or {})

    def add(self, key, value, count=1):
        self.sums[key] += value
        self.counts[key] += count

    def sum(self, key):
        return self.sums.get(key, 0.0)

    def mean(self, key):
        count = self.counts.get(key, 0)
        return self.sums[key] / count if count else math.nan

    def to_dict(self):
        return {"sums": dict(self.sums), "counts": dict(self.counts)}

    @classmethod
    def from_dict(cls, data):
        return cls(data["sums"], data["counts"])

    def __iadd__(self, other):
        for key, value in other.sums.items():
            self.sums[key] += value
        for key, value in other.counts.items():
            self.counts[key] += value
        return self


def add_dicts(a, b):
    """The reduction op for Group.all_reduce over Stats.to_dict() payloads."""
    total = Stats.from_dict(a)
    total += Stats.from_dict(b)
    return total.to_dict()


class GroupStats:
    """Stats summed over every peer of a moolib Group, every `interval` seconds.

    One all-reduce is in flight at a time. If the group changes under it, it fails, and its
    numbers are sent again with the next one, so nothing is lost or counted twice.
    """

    def __init__(self, group, interval):
        self.group = group
        self.interval = interval
        self.unsent = Stats()
        self.sent = Stats()
        self.future = None
        self.last_sent = time.monotonic()  # the first one after `interval`: peers join first

    def add(self, stats):
        self.unsent += stats

    def update(self, total, now):
        """Add a finished reduction into `total` (a Stats); start the next one when it is due."""
        if self.future is not None and self.future.done():
            try:
                total += Stats.from_dict(self.future.result())
            except Exception:  # moolib raises a plain error when the group changed meanwhile
                self.unsent += self.sent
            self.future = None
        if self.future is None and now - self.last_sent >= self.interval:
            self.last_sent = now
            try:
                future = self.group.all_reduce("stats", self.unsent.to_dict(), add_dicts)
            except RuntimeError:
                # Cut off from the group ("local peer is not a member of the specified
                # group"): keep the numbers for the first reduction after it rejoins.
                return
            self.sent, self.unsent, self.future = self.unsent, Stats(), future
