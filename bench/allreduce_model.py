"""The pure parts of the network-scaling benchmark: moolib's all-reduce as a timing model, the
statistics of the measured steps, and the steps/s a real learner would reach.

moolib (0.0.9b0, src/group.h, read for facts) reduces along a binary tree: peer i > 0 sends
its subtree's sum, a whole copy of the gradients, to peer i // 2 once it has its children's
(2i and 2i + 1; peer 0's only child is 1), and peer 0 then sends the result down a second tree,
in which the peer covering the index range (i, end) forwards it to the first index of each half.
Nothing is cut into chunks: every hop is a whole message, stored and forwarded. Before that
gradient round the Accumulator runs a count round of the same shape (a few bytes) to learn that
the batch sizes reach virtual_batch_size (src/accumulator.cc).

The model below replays both rounds on a star network, each peer with its own link of a given
rate in each direction; messages arriving together over one peer's link share it. It serves two
things: the latency term, which this kernel cannot emulate (no netem), and a check that the
measured reduction times are those of the links and not of the two shared CPU cores.
"""

import math
import statistics

MSS_BYTES = 1448  # a TCP segment's payload over Ethernet
INITIAL_WINDOW_SEGMENTS = 10  # Linux's initial congestion window (and after an idle restart)
MIN_RTO_S = 0.2  # Linux's least retransmission timeout: a connection idle longer restarts slowly


def reduce_children(index, peers):
    """The peers that send their subtree's sum to `index` in moolib's reduce tree."""
    return [c for c in (2 * index, 2 * index + 1) if 0 < c < peers and c != index]


def share_children(index, end):
    """[(child, child's end)] to which `index`, covering indices (index, end), sends the result."""
    begin = index + 1
    if begin >= end:
        return []
    mid = begin + (end - begin) // 2
    children = [(begin, mid)]
    if mid != begin:
        children.append((mid, end))
    return children


def shared_finish_times(starts, seconds_alone):
    """Finish times of transfers that share one link fairly (processor sharing), each needing
    seconds_alone on the link by itself; starts in any order."""
    order = sorted(range(len(starts)), key=lambda k: starts[k])
    left = {k: seconds_alone for k in order}
    finish, now, pending = {}, None, list(order)
    active = []
    while pending or active:
        if not active:
            now = max(now or 0.0, starts[pending[0]])
        while pending and starts[pending[0]] <= now + 1e-15:
            active.append(pending.pop(0))
        next_start = starts[pending[0]] if pending else math.inf
        first_done = min(left[k] for k in active) * len(active)
        step = min(first_done, next_start - now)
        for k in active:
            left[k] -= step / len(active)
        now += step
        for k in [k for k in active if left[k] <= 1e-12]:
            finish[k] = now
            active.remove(k)
    return [finish[k] for k in range(len(starts))]


def slow_start_seconds(size_bytes, rate_bps, one_way_s):
    """Extra time of a transfer on a connection that restarts from the initial window after
    being idle: one round trip per doubling of the window up to what the link holds, less the
    time the data sent meanwhile would have taken at the link's rate anyway."""
    rtt = 2 * one_way_s
    in_flight = min(size_bytes, rate_bps / 8 * rtt)
    rounds = math.ceil(math.log2(max(1.0, in_flight / (INITIAL_WINDOW_SEGMENTS * MSS_BYTES))))
    sent_meanwhile = min(size_bytes, INITIAL_WINDOW_SEGMENTS * MSS_BYTES * (2**rounds - 1))
    return max(0.0, rounds * rtt - sent_meanwhile * 8 / rate_bps)


def one_round_seconds(peers, size_bytes, rate_bps, one_way_s, slow_start=False):
    """Time of one all-reduce round of size_bytes among peers, every link rate_bps each way."""
    if peers <= 1:
        return 0.0
    alone = size_bytes * 8 / rate_bps
    extra = one_way_s + (slow_start_seconds(size_bytes, rate_bps, one_way_s) if slow_start else 0)
    ready = [0.0] * peers  # when each peer has its subtree's sum; all hand over at 0
    for index in range(peers - 1, -1, -1):  # children have higher indices than their parent
        children = reduce_children(index, peers)
        if children:
            arrivals = shared_finish_times([ready[c] for c in children], alone)
            ready[index] = max(ready[index], max(arrivals) + extra)
    received = {0: ready[0]}
    todo = [(0, peers)]
    while todo:
        index, end = todo.pop()
        children = share_children(index, end)
        sends = shared_finish_times([received[index]] * len(children), alone)
        for (child, child_end), done in zip(children, sends, strict=True):
            received[child] = done + extra
            todo.append((child, child_end))
    return max(received.values())


def step_seconds(peers, size_bytes, rate_bps, one_way_s, slow_start=False):
    """The model's reduction time of one optimizer step: the count round, then the gradients."""
    count = one_round_seconds(peers, 16, rate_bps, one_way_s)
    return count + one_round_seconds(peers, size_bytes, rate_bps, one_way_s, slow_start)


def hops_on_critical_path(peers):
    """Messages one after another in one round: up the reduce tree, then down the share tree."""
    if peers <= 1:
        return 0
    up = max(index.bit_length() for index in range(1, peers))  # peer i is i.bit_length() deep

    def down(index, end):
        return max((1 + down(c, e) for c, e in share_children(index, end)), default=0)

    return up + down(0, peers)


def latency_seconds(peers, size_bytes, rate_bps, one_way_s, step_s):
    """The modelled latency term of one optimizer step: what one_way_s adds to the model's time
    (with TCP's slow restart when the links idle longer than the least timeout between steps)."""
    # A link carries at least its peer's share up and the result down; the rest of the step it
    # idles, and Linux restarts a connection idle longer than its timeout from the initial window.
    idle_s = step_s - 2 * size_bytes * 8 / rate_bps
    slow_start = idle_s > MIN_RTO_S + 2 * one_way_s
    with_latency = step_seconds(peers, size_bytes, rate_bps, one_way_s, slow_start)
    return with_latency - step_seconds(peers, size_bytes, rate_bps, 0.0)


def percentile(values, fraction):
    """The value below which `fraction` of values lie (linear between neighbours)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    position = fraction * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def window_steps(peer_records, start, end):
    """The optimizer steps that every peer handed over to and received within [start, end]:
    [(model version, last hand-over, last arrival)], from each peer's [handed over, received,
    version] records (bench/standin_peer.py)."""
    by_version = {}
    for records in peer_records:
        for handed, received, version in records:
            if received is not None:
                by_version.setdefault(version, []).append((handed, received))
    steps = []
    for version, times in sorted(by_version.items()):
        if len(times) == len(peer_records) and start <= min(t for _, t in times):
            last_arrival = max(t for _, t in times)
            if last_arrival <= end:
                steps.append((version, max(h for h, _ in times), last_arrival))
    return steps


def summarize_steps(steps, seconds):
    """Steps/s and the reduction's time (last hand-over to last arrival) of a window."""
    reductions = [arrived - handed for _, handed, arrived in steps]
    return {
        "steps": len(steps),
        "steps_per_s": len(steps) / seconds if seconds > 0 else math.nan,
        "reduce_median_ms": 1e3 * statistics.median(reductions) if reductions else math.nan,
        "reduce_p95_ms": 1e3 * percentile(reductions, 0.95),
    }


def learner_seconds(env_steps_per_s, batch_size, unroll_length):
    """Time a learner of env_steps_per_s takes for one batch of batch_size x unroll_length."""
    return batch_size * unroll_length / env_steps_per_s


def real_learner_rate(batch_s, reduce_s, peers, env_steps_per_batch):
    """Optimizer steps/s, env steps/s of the group and the all-reduce's share of a step, for
    peers whose learner takes batch_s per batch. examples/vtrace/learner.py starts the next
    batch only once the Accumulator wants gradients again, so compute and reduction add up."""
    step = batch_s + reduce_s
    return {
        "steps_per_s": 1 / step,
        "env_steps_per_s": peers * env_steps_per_batch / step,
        "reduce_share": reduce_s / step,
    }


def largest_group(rows, learner_key, share_limit=0.1):
    """Per (model, link): the largest measured peer count up to which every measured group's
    reduce_share (in row[learner_key]) stays under share_limit; 0 when the smallest is over."""
    by_key = {}
    for row in sorted(rows, key=lambda r: r["peers"]):
        by_key.setdefault((row["model"], row["link"]), []).append(row)
    best = {}
    for key, group_rows in by_key.items():
        best[key] = 0
        for row in group_rows:
            share = row.get(learner_key, {}).get("reduce_share")
            if share is None or share >= share_limit:
                break
            best[key] = row["peers"]
    return best


def batches_per_step_needed(reduce_s, batch_s, share_limit=0.1):
    """How many batches each peer must add up per optimizer step (virtual_batch_size =
    k x peers x batch_size) for the reduction to stay under share_limit of a step."""
    return max(1, math.ceil(reduce_s * (1 - share_limit) / (share_limit * batch_s)))
