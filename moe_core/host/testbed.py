"""An emulated multi-node cluster on one Linux host: a network namespace per node, rate-limited links.

    with EmulatedTestbed(nodes=2, rate_mbit=1000) as testbed:
        subprocess.run(["ip", "netns", "exec", testbed.netns(1), ...], env={"GLOO_SOCKET_IFNAME": "eth0"})

Layout (reference/ecosystem.md, appendix "An emulated multi-node cluster on one Linux machine"):

    <prefix>-sw    the switch: bridge ``br0`` and the switch side ``v<k>`` of every node's veth pair
    <prefix>-n<k>  node k: ``lo`` and ``eth0`` (the peer of ``v<k>``), address 198.18.0.<k+1>/15

Every node link is shaped with ``tc tbf`` in both directions: on the node's ``eth0`` (node -> switch)
and on the switch's ``v<k>`` (switch -> node), so each node sends and receives at most ``rate_mbit``
over real TCP, and flows that share a node's link contend for it. Ranks of one node reach each other
through the namespace's local routes (loopback), which are not shaped: intra-node traffic is fast,
inter-node traffic crosses the links, the NVLink-vs-NIC gap in miniature.

Why the bridge sits in its own namespace rather than in the host's: nothing is created in the host's
network namespace (no host interface, address or route changes, no host firewall rule such as
Docker's FORWARD DROP applies to the bridged traffic), no traffic can leave these namespaces, interface
names are fixed and short inside each namespace (within Linux's 15-character limit and collision-free
between testbeds), and deleting the namespaces removes every interface and qdisc with them.
Addresses come from 198.18.0.0/15 (RFC 2544 benchmarking range) and exist only inside the namespaces.

Needs root and iproute2 (``ip``, ``tc``); :func:`emulation_unavailable` says why a host cannot.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence

SUBNET = ipaddress.IPv4Network("198.18.0.0/15")
_instances = itertools.count()
_live: set[EmulatedTestbed] = set()  # testbeds built by this process and not yet torn down
_DEFAULT_PREFIX = re.compile(r"^mt(\d+)-\d+$")  # prefixes this module makes up: mt<pid>-<instance>


class TestbedError(RuntimeError):
    """A command that builds or tears down the testbed failed; the message names it and its stderr."""


def _run(*cmd: str) -> str:
    """Run one command; return its stdout, or raise TestbedError naming the command and its stderr."""
    try:
        done = subprocess.run(cmd, capture_output=True, text=True)
    except OSError as err:
        raise TestbedError(f"`{' '.join(cmd)}` could not start: {err}") from None
    if done.returncode != 0:
        raise TestbedError(f"`{' '.join(cmd)}` failed (exit {done.returncode}): {done.stderr.strip()}")
    return done.stdout


def emulation_unavailable() -> str | None:
    """Why the emulated testbed cannot be built on this host, or None when it can.

    Probes by creating (and deleting) a namespace with a tbf qdisc, which catches containers that
    forbid namespaces and kernels without sch_tbf.
    """
    if os.geteuid() != 0:
        return f"needs root to create network namespaces, running as uid {os.geteuid()}"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found; install iproute2"
    probe = f"mt{os.getpid()}-probe"
    try:
        _run("ip", "netns", "add", probe)
        try:
            _run("ip", "-n", probe, "link", "set", "lo", "up")
            _run(
                "ip",
                "netns",
                "exec",
                probe,
                "tc",
                "qdisc",
                "add",
                "dev",
                "lo",
                "root",
                "tbf",
                "rate",
                "1gbit",
                "burst",
                "256kb",
                "latency",
                "50ms",
            )
        finally:
            _run("ip", "netns", "del", probe)
    except TestbedError as err:
        return str(err)
    return None


def remove_stale_testbeds() -> list[str]:
    """Delete the namespaces of testbeds whose creating process is gone (e.g. it was SIGKILLed).

    Only namespaces named with this module's default prefix ``mt<pid>-<n>-...`` are considered,
    and only when no process with that pid exists. Returns the deleted namespace names.
    """
    removed = []
    for line in _run("ip", "netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        match = _DEFAULT_PREFIX.match(name.rsplit("-", 1)[0])
        if match and not _pid_alive(int(match.group(1))):
            _delete_netns(name)
            removed.append(name)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by another user
    return True


def _delete_netns(name: str) -> None:
    """Kill what still runs inside namespace ``name`` (it would keep it alive), then delete it."""
    for pid in _run("ip", "netns", "pids", name).split():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)
    _run("ip", "netns", "del", name)


class EmulatedTestbed:
    """``nodes`` emulated nodes joined by a switch through links of ``rate_mbit`` per direction
    (one rate for every node, or a list of one per node: nodes of unequal speed).

    ``burst_kb`` and ``latency_ms`` are tbf's bucket size and queue bound (packets that would wait
    longer are dropped); neither adds delay. ``prefix`` names the namespaces; the default
    ``mt<pid>-<n>`` is unique per process and instance, so parallel tests and jobs never collide.
    Entering builds everything; leaving always tears it down, also on exceptions, KeyboardInterrupt
    and SIGTERM; an atexit hook catches the rest, :func:`remove_stale_testbeds` a SIGKILLed creator.
    """

    def __init__(
        self,
        nodes: int,
        rate_mbit: float | Sequence[float],
        burst_kb: int = 256,
        latency_ms: float = 50.0,
        prefix: str | None = None,
    ):
        if nodes < 1 or nodes > SUBNET.num_addresses - 2:
            raise ValueError(f"nodes must be in 1..{SUBNET.num_addresses - 2}, got {nodes}")
        rates = [rate_mbit] * nodes if isinstance(rate_mbit, int | float) else list(rate_mbit)
        if len(rates) != nodes:
            raise ValueError(f"rate_mbit must be one rate or one per node ({nodes}), got {len(rates)} rates")
        if min(rates) <= 0 or burst_kb <= 0 or latency_ms <= 0:
            raise ValueError(
                f"rate_mbit, burst_kb and latency_ms must be > 0, got {rate_mbit}, {burst_kb}, {latency_ms}"
            )
        self.nodes = nodes
        self.tbf = [
            ["tbf", "rate", f"{rate:g}mbit", "burst", f"{burst_kb}kb", "latency", f"{latency_ms:g}ms"] for rate in rates
        ]
        self.prefix = prefix or f"mt{os.getpid()}-{next(_instances)}"
        self.switch = f"{self.prefix}-sw"
        self._created: list[str] = []  # namespaces, in creation order
        self._previous_sigterm = None

    def netns(self, node: int) -> str:
        """Name of node ``node``'s network namespace (for ``ip netns exec``)."""
        self._check(node)
        return f"{self.prefix}-n{node}"

    def address(self, node: int) -> str:
        """IPv4 address of node ``node``'s ``eth0``."""
        self._check(node)
        return str(SUBNET.network_address + node + 1)

    def _check(self, node: int) -> None:
        if not 0 <= node < self.nodes:
            raise IndexError(f"node {node} out of range 0..{self.nodes - 1}")

    def __enter__(self) -> EmulatedTestbed:
        remove_stale_testbeds()
        _live.add(self)
        if threading.current_thread() is threading.main_thread():
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            self._build()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _build(self) -> None:
        sw = self.switch
        self._add_netns(sw)
        _run("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", sw, "link", "set", "br0", "up")
        for k in range(self.nodes):
            ns, port = self.netns(k), f"v{k}"
            self._add_netns(ns)
            _run("ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "-n", sw, "link", "set", port, "master", "br0")
            _run("ip", "-n", sw, "link", "set", port, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(k)}/{SUBNET.prefixlen}", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "add", "dev", "eth0", "root", *self.tbf[k])  # node -> switch
            _run("ip", "netns", "exec", sw, "tc", "qdisc", "add", "dev", port, "root", *self.tbf[k])  # switch -> node

    def _add_netns(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._created.append(name)

    def __exit__(self, exc_type, exc, tb) -> None:
        errors = self.teardown()
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)
            self._previous_sigterm = None
        if errors:
            message = "testbed teardown incomplete: " + "; ".join(errors)
            if exc_type is None:
                raise TestbedError(message)
            print(f"warning: {message}", file=sys.stderr)

    def teardown(self) -> list[str]:
        """Delete every namespace this testbed created (nodes first, then the switch); idempotent.

        Returns the errors; every namespace is attempted even when one fails.
        """
        errors = []
        while self._created:  # popped one by one, so a teardown interrupted by a signal can be resumed
            try:
                _delete_netns(self._created.pop())
            except TestbedError as err:
                errors.append(str(err))
        _live.discard(self)
        return errors


def _exit_on_sigterm(signum, frame) -> None:
    """Turn SIGTERM (Snakemake or SLURM cancelling a job) into an exception, so ``with`` blocks unwind."""
    raise SystemExit(128 + signum)


@atexit.register
def _teardown_live() -> None:
    for testbed in list(_live):
        for error in testbed.teardown():
            print(f"warning: testbed teardown at exit: {error}", file=sys.stderr)
