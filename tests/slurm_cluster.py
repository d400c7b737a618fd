"""A real SLURM cluster on this host for the tests: this host as its one node, or several nodes,
each in namespaces of its own.

:func:`started_cluster` installs Debian's ``slurm-wlm`` and ``munge`` when they are missing, starts
munged and slurmctld on this host from a temporary directory (own key, socket, ports, state) and
one slurmd per node, and stops them all afterwards, failed test or not.

One node (``nodes=1``): slurmd runs on this host, as this host. Its configuration is at the default
path /etc/slurm/slurm.conf: Snakemake's SLURM jobstep removes SLURM_CONF (with every other SLURM_*
variable but SLURM_JOB_ID) from a rule's environment, so ``srun`` and ``scontrol`` inside a job only
find the default. The cluster never overwrites a configuration it did not write.

Several nodes (``nodes=N``): node ``node<k>`` is a slurmd in a network namespace and a UTS
namespace (its host name) of its own, joined to this host by a switch, a bridge in a namespace of
its own (:class:`Network`), in a private /24 that exists only inside these namespaces and on the
one interface this host gets into the switch. Each node also gets a mount namespace in which this
cluster's folder is bind-mounted over /etc/slurm (the default configuration path, for the jobs'
``srun`` and ``scontrol``) and a hosts file over /etc/hosts that names the controller and every
node, as a cluster's DNS would: torchrun's rendezvous and gloo resolve the node names. This host's
/etc is never written, so the cluster can run beside the one-node cluster. The nodes share munge
through its Unix socket, which is a file and so reachable from every network namespace; each node
has its own spool folder, pid file and log.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

SLURM_CONF = Path("/etc/slurm/slurm.conf")
CONF_MARKER = "# test cluster of tests/slurm_cluster.py, removed when its tests end"
DAEMON_START_S = 60
STOP_S = 10
# The nodes' network: the switch's address on this host first, node k at .k+1. Private (RFC 1918)
# addresses, created only on interfaces of these namespaces and on the one host interface into them.
SUBNET = ipaddress.IPv4Network("10.99.0.0/24")


def snakemake_slurm(results: Path) -> list[str]:
    """Snakemake through the suite's SLURM profile on a test cluster, before its --config values and
    targets: no slurmdbd, so no account to guess; poll soon and often, the jobs take seconds. The
    SLURM job logs go under ``results``: the plugin removes the empty folders of its log directory
    when a run ends, which pulls a just-submitted job's log folder from under another run sharing
    the checkout's default one (the job then fails before it starts)."""
    return [
        "snakemake",
        "--executor",
        "slurm",
        "--profile",
        "configs/profiles/slurm",
        "--slurm-no-account",
        f"--slurm-logdir={results / 'slurm_logs'}",
        "--slurm-init-seconds-before-status-checks=2",
        "--seconds-between-status-checks=2",
        "--latency-wait=5",
        "--configfile",
        "configs/ci.yaml",
    ]


def run(*argv: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a command to completion, capturing its output as text."""
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)


def check(*argv: str) -> str:
    """Run a command that must succeed (building the network); its stdout."""
    proc = run(*argv)
    assert proc.returncode == 0, f"`{' '.join(argv)}` failed: {proc.stderr.strip()}"
    return proc.stdout


def install_slurm() -> None:
    """apt-get the SLURM daemons and munge when missing (about 15 s on a fresh Debian machine)."""
    if all(shutil.which(tool) for tool in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for argv in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
        proc = run(*argv, env=env, timeout=600)
        assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{proc.stdout}\n{proc.stderr}"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


def why_no_cluster(nodes: int) -> str | None:
    """Why this host cannot run a cluster of ``nodes`` nodes (the reason to skip), or None."""
    if os.geteuid() != 0:
        return "needs root: installs slurm-wlm and munge with apt-get and starts munged, slurmctld, slurmd"
    if nodes == 1:
        if SLURM_CONF.exists() and not SLURM_CONF.read_text().startswith(CONF_MARKER):
            return f"{SLURM_CONF} exists: this host already belongs to a SLURM cluster, which the test leaves alone"
        return None
    return Network.unavailable()


class Network:
    """The nodes' network: a bridge in namespace ``<prefix>-sw``, node k's namespace ``<prefix>-n<k>``
    with ``eth0`` on it, and this host's interface ``<prefix>`` on it with the controller's address.

    The bridge sits in a namespace of its own so that no firewall of this host (bridged traffic
    passes iptables where br_netfilter is loaded) can drop the nodes' traffic; deleting the
    namespaces removes every interface with them.
    """

    def __init__(self, nodes: int):
        self.nodes = nodes
        self.prefix = f"msl{os.getpid()}"
        self.switch = f"{self.prefix}-sw"
        self.created: list[str] = []  # namespaces, in creation order

    @staticmethod
    def unavailable() -> str | None:
        """Why namespaces, veths and the subnet cannot be had here, or None; probes by making them."""
        if shutil.which("ip") is None or shutil.which("unshare") is None:
            return "needs `ip` (iproute2) and `unshare` (util-linux) to build the nodes' namespaces"
        taken = [line for line in run("ip", "-4", "route", "show").stdout.splitlines() if _overlaps(line)]
        if taken:
            return f"{SUBNET}, the test nodes' subnet, is routed on this host already: {taken[0]}"
        probe = Network(1)
        probe.prefix = f"msl{os.getpid()}p"
        try:
            probe.build()
        except AssertionError as err:
            return f"cannot build network namespaces joined by veths here: {err}"
        finally:
            probe.remove()
        return None

    def host_address(self) -> str:
        return str(SUBNET.network_address + 1)

    def address(self, node: int) -> str:
        """Node ``node``'s address (nodes count from 1)."""
        return str(SUBNET.network_address + 1 + node)

    def netns(self, node: int) -> str:
        return f"{self.prefix}-n{node}"

    def build(self) -> None:
        """Make the switch, this host's interface on it and every node's namespace and link."""
        sw = self.switch
        self._add_netns(sw)
        check("ip", "-n", sw, "link", "add", "br0", "type", "bridge")
        check("ip", "-n", sw, "link", "set", "br0", "up")
        self._plug(self.prefix, "host", None, self.host_address())
        for node in range(1, self.nodes + 1):
            self._add_netns(self.netns(node))
            self._plug("eth0", f"v{node}", self.netns(node), self.address(node))

    def _plug(self, name: str, port: str, netns: str | None, address: str) -> None:
        """A veth from switch port ``port`` to interface ``name`` in ``netns`` (None: this host)."""
        where = ["netns", netns or str(os.getpid())]
        check("ip", "-n", self.switch, "link", "add", port, "type", "veth", "peer", "name", name, *where)
        check("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
        inside = ["ip", "-n", netns] if netns else ["ip"]
        check(*inside, "addr", "add", f"{address}/{SUBNET.prefixlen}", "dev", name)
        check(*inside, "link", "set", name, "up")
        if netns:
            check(*inside, "link", "set", "lo", "up")

    def _add_netns(self, name: str) -> None:
        check("ip", "netns", "add", name)
        self.created.append(name)

    def remove(self) -> None:
        """Kill what still runs in the namespaces, delete them (this host's veth goes with the switch)."""
        while self.created:
            name = self.created.pop()
            kill_all(run("ip", "netns", "pids", name).stdout.split())
            run("ip", "netns", "del", name)


def _overlaps(route: str) -> bool:
    """Whether the ``ip route`` line ``route`` is a network that overlaps SUBNET (not the default)."""
    dest = route.split()[0] if route.strip() else "default"
    return dest != "default" and ipaddress.IPv4Network(dest, strict=False).overlaps(SUBNET)


def kill_all(pids: list[str]) -> None:
    """SIGKILL every process of ``pids`` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid), signal.SIGKILL)


class Cluster:
    """A SLURM cluster with its state, logs, configuration and munge socket in ``root``: this host
    as its one node (``nodes=1``), or ``nodes`` nodes ``node1``, ``node2``, ... in namespaces."""

    def __init__(self, root: Path, nodes: int = 1):
        self.root = root
        self.net = Network(nodes) if nodes > 1 else None
        self.conf = SLURM_CONF if nodes == 1 else root / "etc" / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: dict[str, subprocess.Popen] = {}

    @property
    def nodes(self) -> list[str]:
        """The nodes' names, as SLURM and the nodes themselves know them."""
        return [f"node{k}" for k in range(1, self.net.nodes + 1)] if self.net else [socket.gethostname()]

    def start(self) -> None:
        """munged, the network of a multi-node cluster, slurmctld, every slurmd; until all nodes are idle."""
        socket_path = self._start_munge()
        for sub in ("state", "spool", "log", "etc"):
            (self.root / sub).mkdir()
        if self.net:
            self.net.build()
        self.conf.parent.mkdir(parents=True, exist_ok=True)
        self.conf.write_text(self._slurm_conf(socket_path))
        self._spawn("slurmctld", ["slurmctld", "-D"])
        for k, node in enumerate(self.nodes, start=1):
            self._spawn(f"slurmd-{node}", self._slurmd_argv(k, node))
        self._wait(self._all_idle, f"nodes {','.join(self.nodes)} idle in sinfo")

    def _start_munge(self) -> Path:
        """munged with a key of its own; the path of its socket."""
        munge_dir = self.root / "munge"
        munge_dir.mkdir(mode=0o755)
        key = munge_dir / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        munge_user = pwd.getpwnam("munge")
        for path in (munge_dir, key):
            os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
        socket_path = munge_dir / "munge.socket"
        files = {f"--{kind}-file": munge_dir / f"munged.{kind}" for kind in ("pid", "log", "seed")}
        options = [f"{flag}={path}" for flag, path in files.items()]
        self._spawn(
            "munged",
            ["runuser", "-u", "munge", "--", "munged", "--foreground", f"--socket={socket_path}", f"--key-file={key}"]
            + options,
        )
        self._wait(lambda: socket_path.exists(), "munged socket")
        return socket_path

    def _slurm_conf(self, socket_path: Path) -> str:
        """slurm.conf: this host controls; every node exactly as slurmd sees this host's hardware
        (CPUs, sockets, cores, threads, RealMemory), so that none is drained for a mismatch."""
        hardware = run("slurmd", "-C").stdout.splitlines()[0].split(maxsplit=1)[1]
        host = socket.gethostname()
        if self.net:
            controller = f"{host}({self.net.host_address()})"
            nodes = "\n".join(
                f"NodeName={node} NodeAddr={self.net.address(k)} {hardware}" for k, node in enumerate(self.nodes, 1)
            )
        else:
            controller, nodes = host, f"NodeName={host} {hardware}"
        return f"""\
{CONF_MARKER}
ClusterName=moetest
SlurmctldHost={controller}
SlurmUser=root
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={socket_path}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
# squeue must still list a finished job when snakemake's plugin asks for its state.
MinJobAge=300
KillWait=5
ReturnToService=2
StateSaveLocation={self.root / "state"}
SlurmdSpoolDir={self.root / "spool" / "%n"}
SlurmctldPidFile={self.root / "slurmctld.pid"}
SlurmdPidFile={self.root / "slurmd-%n.pid"}
SlurmctldLogFile={self.root / "log" / "slurmctld.log"}
SlurmdLogFile={self.root / "log" / "slurmd-%n.log"}
{nodes}
PartitionName=test Nodes={",".join(self.nodes)} Default=YES MaxTime=INFINITE State=UP
"""

    def _slurmd_argv(self, k: int, node: str) -> list[str]:
        """slurmd of node ``node`` (the ``k``-th): on this host, or in its namespaces (module docstring)."""
        (self.root / "spool" / node).mkdir(exist_ok=True)
        if not self.net:
            return ["slurmd", "-D", "-N", node]
        hosts = self.root / "etc" / "hosts"
        if not hosts.exists():
            names = [(self.net.host_address(), socket.gethostname())]
            names += [(self.net.address(i), name) for i, name in enumerate(self.nodes, 1)]
            hosts.write_text("127.0.0.1 localhost\n" + "".join(f"{addr} {name}\n" for addr, name in names))
        inside = (
            f"hostname {node} && mount --bind {self.conf.parent} /etc/slurm && mount --bind {hosts} /etc/hosts "
            f"&& exec slurmd -D -N {node}"
        )
        # nsenter, not `ip netns exec`, which remounts /sys without the cgroup file system slurmd needs.
        netns = f"--net=/run/netns/{self.net.netns(k)}"
        return ["nsenter", netns, "unshare", "--uts", "--mount", "sh", "-c", inside]

    def kill_node(self, node: str) -> None:
        """A node lost mid-job: SIGKILL its slurmd, then everything else on it (job steps, ranks)."""
        self.daemons[f"slurmd-{node}"].kill()
        self.daemons[f"slurmd-{node}"].wait()
        kill_all(run("ip", "netns", "pids", self.net.netns(self.nodes.index(node) + 1)).stdout.split())

    def revive_node(self, node: str) -> None:
        """Start a lost node's slurmd again; until every node is idle (ReturnToService=2 takes it back)."""
        self._spawn(f"slurmd-{node}", self._slurmd_argv(self.nodes.index(node) + 1, node))
        self._wait(self._all_idle, f"node {node} back, idle in sinfo")

    def _all_idle(self) -> bool:
        states = run("sinfo", "-h", "-N", "-o", "%t", env=self.env).stdout.split()
        return states == ["idle"] * len(self.nodes)

    def _spawn(self, name: str, argv: list[str]) -> None:
        with open(self.root / f"{name}.out", "w") as log:
            self.daemons[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + DAEMON_START_S
        while not ready():
            dead = {name: p.returncode for name, p in self.daemons.items() if p.poll() is not None}
            assert not dead and time.monotonic() < deadline, f"waiting for {what}: exited {dead}\n{self.logs()}"
            time.sleep(0.2)

    def logs(self) -> str:
        files = [*self.root.glob("*.out"), *(self.root / "log").glob("*.log"), *self.root.glob("munge/*.log")]
        return "\n".join(f"== {f.name}\n{f.read_text()[-3000:]}" for f in files if f.exists())

    def stop(self) -> None:
        """Cancel every job of this cluster, stop the daemons, remove the network and the configuration."""
        if "slurmctld" in self.daemons and self.daemons["slurmctld"].poll() is None:
            run("scancel", "--user", "root", env=self.env)
            deadline = time.monotonic() + 3 * STOP_S
            while run("squeue", "-h", env=self.env).stdout.strip() and time.monotonic() < deadline:
                time.sleep(0.2)
        for proc in reversed(list(self.daemons.values())):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=STOP_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        if self.net:
            self.net.remove()
        if self.conf.is_file() and self.conf.read_text().startswith(CONF_MARKER):
            self.conf.unlink()


@contextlib.contextmanager
def started_cluster(nodes: int = 1) -> Iterator[Cluster]:
    """A started :class:`Cluster` of ``nodes`` nodes, always stopped afterwards; skips the test
    (:func:`why_no_cluster`) where this host cannot run one."""
    reason = why_no_cluster(nodes)
    if reason:
        pytest.skip(reason)
    install_slurm()
    # Not pytest's tmp_path: munged needs every directory above its socket searchable by all.
    root = Path(tempfile.mkdtemp(prefix="moe-slurm-"))
    root.chmod(0o755)
    cluster = Cluster(root, nodes)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
