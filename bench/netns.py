"""Emulated hosts for the network-scaling benchmark: one network namespace per peer, each joined by
its own veth link to a hub namespace (a bridge, where the broker lives), a star.

Each link can be given a bandwidth (an htb class on both ends of the veth, so both directions are
limited). Latency cannot be added on this kernel: it has no netem (nor fq, for a BPF-set departure
time), so bench/netscaling.py models the latency term instead of emulating it.

Everything is named after this process's pid (`msc<pid>...`), so that concurrent runs never
collide, and `Network.close()` removes all of it; namespaces left by a run that was SIGKILLed
(pid gone) are removed by the next one (`remove_stale`).

Only the standard library and the `ip`/`tc` commands of iproute2; every command is bounded.
"""

import json
import os
import re
import shutil
import subprocess

PREFIX = "msc"  # namespaces of this benchmark: msc<pid>hub, msc<pid>p<i>
BURST_FLOOR = 1600  # bytes: about one full-size Ethernet frame
SUBNET = "10.215.0.{}"  # inside this run's namespaces only: the hub is .1, peer i is .(i + 10)
COMMAND_TIMEOUT_S = 30


class NamespacesUnavailable(RuntimeError):
    """Network namespaces (or htb) cannot be used here; the message says why, in one line."""


def run(*args, check=True):
    return subprocess.run(
        [str(a) for a in args], check=check, capture_output=True, text=True,
        timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip


def why_unavailable():
    """None where namespaces, veth links and htb work; else the reason, in one line."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"the `{tool}` command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}probe"
    try:
        run("ip", "netns", "add", probe)
        try:
            run("ip", "-n", probe, "link", "set", "lo", "up")
            run("tc", "-n", probe, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "htb")
        finally:
            run("ip", "netns", "del", probe, check=False)
    except subprocess.CalledProcessError as e:
        detail = (e.stderr or e.stdout or "").strip().splitlines()
        return f"cannot create network namespaces with htb links here ({' '.join(e.cmd[:4])}: " \
            f"{detail[-1] if detail else e.returncode})"  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"cannot create network namespaces here ({e})"
    return None


def our_namespaces(pid=None):
    """Names of the namespaces of this benchmark (of one run when pid is given)."""
    listing = run("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in listing.splitlines() if line.strip()]
    pattern = re.compile(rf"{PREFIX}(\d+)(hub|p\d+)$")
    return [n for n in names if (m := pattern.match(n)) and (pid is None or int(m[1]) == pid)]


def remove_stale():
    """Remove namespaces of runs whose process is gone (a run that was SIGKILLed)."""
    for name in our_namespaces():
        pid = int(re.match(rf"{PREFIX}(\d+)", name)[1])
        if pid != os.getpid() and not os.path.exists(f"/proc/{pid}"):
            run("ip", "netns", "del", name, check=False)


def htb_settings(rate_mbit):
    """htb's rate and burst for a link of rate_mbit: a burst of 2 ms at that rate, so that the
    kernel's timer granularity does not cap fast links, but no more, so that a message of a
    small model does not slip through a slow link in one burst (at least one frame)."""
    burst_bytes = max(BURST_FLOOR, int(rate_mbit * 1e6 / 8 * 0.002))
    return ["rate", f"{rate_mbit}mbit", "burst", str(burst_bytes), "cburst", str(burst_bytes)]


class Network:
    """The hub and peer namespaces of one run. `address(i)` is peer i's address, `hub_address`
    the broker's; `exec_args(i)` prefixes a command to run it on peer i's host."""

    def __init__(self, tag=None):
        self.tag = f"{PREFIX}{tag if tag is not None else os.getpid()}"
        self.hub = f"{self.tag}hub"
        self.hub_address = SUBNET.format(1)
        self.peers = {}  # index -> namespace
        self.rate_mbit = None
        self.closed = False
        remove_stale()
        run("ip", "netns", "add", self.hub)
        run("ip", "-n", self.hub, "link", "set", "lo", "up")
        run("ip", "-n", self.hub, "link", "add", "br0", "type", "bridge")
        run("ip", "-n", self.hub, "addr", "add", f"{self.hub_address}/24", "dev", "br0")
        run("ip", "-n", self.hub, "link", "set", "br0", "up")

    def address(self, index):
        return SUBNET.format(index + 10)

    def add_peer(self, index):
        """Peer `index`'s namespace and its link to the hub (with the current rate)."""
        name = f"{self.tag}p{index}"
        run("ip", "netns", "add", name)
        self.peers[index] = name
        run("ip", "-n", name, "link", "set", "lo", "up")
        hub_end = f"v{index}"
        run("ip", "-n", self.hub, "link", "add", hub_end, "type", "veth",
            "peer", "name", "eth0", "netns", name)  # fmt: skip
        run("ip", "-n", self.hub, "link", "set", hub_end, "master", "br0", "up")
        run("ip", "-n", name, "addr", "add", f"{self.address(index)}/24", "dev", "eth0")
        run("ip", "-n", name, "link", "set", "eth0", "up")
        self._limit(index, self.rate_mbit)
        return name

    def ends(self, index):
        """(namespace, device) of both ends of peer index's link: the peer's, the hub's."""
        return [(self.peers[index], "eth0"), (self.hub, f"v{index}")]

    def _limit(self, index, rate_mbit):
        for namespace, device in self.ends(index):
            # htb cannot be changed in place: the old one goes (queued packets with it; TCP
            # resends them, during the warm-up that follows a change).
            run("tc", "-n", namespace, "qdisc", "del", "dev", device, "root", check=False)
            if rate_mbit is None:
                continue
            run("tc", "-n", namespace, "qdisc", "add", "dev", device, "root",
                "handle", "1:", "htb", "default", "1")  # fmt: skip
            run("tc", "-n", namespace, "class", "add", "dev", device, "parent", "1:",
                "classid", "1:1", "htb", *htb_settings(rate_mbit))  # fmt: skip

    def set_rate(self, rate_mbit):
        """Every link's bandwidth, both directions (None: no limit but the CPUs')."""
        self.rate_mbit = rate_mbit
        for index in self.peers:
            self._limit(index, rate_mbit)

    def byte_counts(self):
        """{peer index: bytes through its link so far, both directions}, read on the hub."""
        listing = json.loads(run("ip", "-j", "-s", "-n", self.hub, "link", "show").stdout)
        by_device = {link["ifname"]: link["stats64"] for link in listing}
        counts = {}
        for index in self.peers:
            stats = by_device.get(f"v{index}", {})
            counts[index] = sum(stats.get(way, {}).get("bytes", 0) for way in ("rx", "tx"))
        return counts

    def exec_args(self, index):
        return ["ip", "netns", "exec", self.peers[index]]

    def hub_exec_args(self):
        return ["ip", "netns", "exec", self.hub]

    def remove_peer(self, index):
        run("ip", "netns", "del", self.peers.pop(index), check=False)

    def close(self):
        """Remove every namespace (their links go with them). Safe to call twice."""
        if self.closed:
            return
        self.closed = True
        for index in list(self.peers):
            self.remove_peer(index)
        run("ip", "netns", "del", self.hub, check=False)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
