"""Counters that add up across peers with Group.all_reduce."""

import math
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
