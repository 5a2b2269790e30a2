"""GroupStats: numbers sent while the group changes, or while this peer is cut off from it, are
neither lost nor counted twice."""

from examples.common.stats import GroupStats, Stats


class Done:
    def __init__(self, value=None, error=None):
        self.value, self.error = value, error

    def done(self):
        return True

    def result(self):
        if self.error:
            raise self.error
        return self.value


class FakeGroup:
    """all_reduce of a group of one, or the errors moolib raises."""

    def __init__(self):
        self.cut_off = False
        self.fail_result = False

    def all_reduce(self, name, payload, op):
        if self.cut_off:
            raise RuntimeError("AllReduce: local peer is not a member of the specified group!")
        if self.fail_result:
            return Done(error=RuntimeError("the group changed"))
        return Done(payload)


def one(value):
    stats = Stats()
    stats.add("env_steps", value)
    return stats


def test_numbers_are_kept_through_a_partition_and_a_failed_reduction():
    group, total = FakeGroup(), Stats()
    stats = GroupStats(group, interval=1.0)
    now = stats.last_sent
    stats.add(one(10))
    group.cut_off = True
    stats.update(total, now + 1)  # all_reduce raises: no traceback, nothing sent
    stats.add(one(5))
    group.cut_off, group.fail_result = False, True
    stats.update(total, now + 2)  # sent, and its result will fail
    stats.add(one(1))
    group.fail_result = False
    stats.update(total, now + 3)  # the failure is seen: its numbers go back to the unsent
    stats.update(total, now + 4)  # all of them sent again, and reduced
    stats.update(total, now + 5)
    assert total.sum("env_steps") == 16
