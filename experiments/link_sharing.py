"""How concurrent transfers share links of unequal speed: measured on the emulated testbed, against
the simulator's sharing rule (moe_core.sim.engine).

    python -m experiments link_sharing --out results/link_sharing.json    # as root, with iproute2

Three emulated nodes (moe_core.host.testbed); nodes 0 and 2 have links of ``rate`` per direction, node 1
of half that. Two TCP flows of the same size leave node 0 together: A to node 1, B to node 2. Both
cross node 0's uplink; A also node 1's slower downlink. Two rules predict different things:

* max-min fairness in bytes (the engine's rule, what TCP aims at): each flow gets the same bytes per
  second of the shared uplink unless limited elsewhere. A is held to node 1's rate, which is half
  the uplink, so B gets the other half: both end together;
* equal fractions of each flow's own stand-alone speed (a rule the engine once had): A, whose
  stand-alone speed is half B's, gets half B's rate: B ends first, A a third later than under the
  first rule.

Each flow is first timed alone, which measures the links' real rates (TCP/IP headers take a few
percent of tbf's rate); the engine is given those rates and tc's bucket size and predicts the
concurrent run, which is then measured. Repeated ``--repeats`` times; medians are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

from moe_core.host.testbed import EmulatedTestbed, emulation_unavailable
from moe_core.records.console import table
from moe_core.records.results import ResultsDirError, check_writable
from moe_core.sim.engine import Op, simulate
from moe_core.sim.topology import Transfer

PORT = 5201
CHUNK = 1 << 16
FLOWS = {"A": 1, "B": 2}  # flow -> destination node; every flow leaves node 0
UPLINK, DOWN_1, DOWN_2 = 0, 1, 2  # the links the flows cross: node 0 -> switch, switch -> node 1, -> node 2
FLOW_LINKS = {"A": [UPLINK, DOWN_1], "B": [UPLINK, DOWN_2]}


def receive(connections: int) -> None:
    """Node side: accept ``connections`` flows one after another; read each to its end, then answer
    one byte, so the sender's clock stops when the last byte has arrived."""
    with socket.create_server(("0.0.0.0", PORT)) as server:
        print("listening", flush=True)
        for _ in range(connections):
            conn, _ = server.accept()
            with conn:
                while conn.recv(CHUNK):
                    pass
                conn.sendall(b"k")


def _send(address: str, nbytes: int, start: threading.Barrier, seconds: dict, name: str) -> None:
    payload = bytes(CHUNK)
    with socket.create_connection((address, PORT), timeout=120) as conn:
        start.wait()
        began = time.perf_counter()
        for sent in range(0, nbytes, CHUNK):
            conn.sendall(payload[: min(CHUNK, nbytes - sent)])
        conn.shutdown(socket.SHUT_WR)
        if conn.recv(1) != b"k":
            raise RuntimeError(f"flow {name}: the receiver at {address} closed without confirming")
        seconds[name] = time.perf_counter() - began


def send(addresses: dict[str, str], nbytes: int) -> dict[str, float]:
    """Sender side (node 0): the given flows at once, each ``nbytes``; seconds until each was received."""
    seconds: dict[str, float] = {}
    start = threading.Barrier(len(addresses))
    threads = [threading.Thread(target=_send, args=(a, nbytes, start, seconds, n)) for n, a in addresses.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if set(seconds) != set(addresses):
        raise RuntimeError(f"flows {sorted(set(addresses) - set(seconds))} did not complete")
    return seconds


def predict(rates_Bps: dict[str, float], nbytes: int) -> dict[str, float]:
    """The engine's end times for both flows started together, on links at the measured rates
    (node 0's uplink at B's alone rate, node 1's downlink at A's). tc's buckets are left out: the
    alone runs' rates already include what a bucket lends at the start (256 KB of 12.5 MB)."""
    capacity = np.array([rates_Bps["B"], rates_Bps["A"], rates_Bps["B"]])
    ops = [
        Op(name, "p2p", transfer=Transfer(np.array(links), np.full(len(links), float(nbytes)), 1, True))
        for name, links in FLOW_LINKS.items()
    ]
    ends = simulate(ops, capacity).end_s
    return dict(zip(FLOW_LINKS, map(float, ends)))


def own_speed_fractions(rates_Bps: dict[str, float], nbytes: int) -> dict[str, float]:
    """End times under the other rule: both flows at the same fraction y of their stand-alone speed,
    as large as the shared uplink allows (A alone uses rate_A / rate_B of it), until B ends; then A
    alone."""
    y = 1 / (1 + rates_Bps["A"] / rates_Bps["B"])
    b_end = nbytes / (y * rates_Bps["B"])
    a_left = nbytes - y * rates_Bps["A"] * b_end
    return {"A": b_end + a_left / rates_Bps["A"], "B": b_end}


def run_in(testbed: EmulatedTestbed, node: int, *args: str, **popen) -> subprocess.Popen:
    """This entry point, with ``args``, inside node ``node``'s namespace."""
    cmd = ["ip", "netns", "exec", testbed.netns(node), sys.executable, "-m", "experiments", "link_sharing", *args]
    return subprocess.Popen(cmd, text=True, stdout=subprocess.PIPE, **popen)


def measure(rate_mbit: float, nbytes: int, repeats: int, burst_kb: int) -> dict:
    """Alone and concurrent end times, ``repeats`` times each, on a fresh three-node testbed."""
    runs = {"A": [], "B": [], "together": []}
    with EmulatedTestbed(3, [rate_mbit, rate_mbit / 2, rate_mbit], burst_kb=burst_kb) as testbed:
        addresses = {flow: testbed.address(node) for flow, node in FLOWS.items()}
        receivers = [run_in(testbed, node, "--receive", str(2 * repeats)) for node in FLOWS.values()]
        try:
            for r in receivers:
                if r.stdout.readline().strip() != "listening":
                    raise RuntimeError("a receiver did not start; see its error above")
            for _ in range(repeats):
                for flow in FLOWS:
                    runs[flow].append(_sender(testbed, {flow: addresses[flow]}, nbytes)[flow])
                runs["together"].append(_sender(testbed, addresses, nbytes))
        finally:
            for r in receivers:
                r.wait(timeout=60)
    return runs


def _sender(testbed: EmulatedTestbed, addresses: dict[str, str], nbytes: int) -> dict[str, float]:
    sender = run_in(testbed, 0, "--send", json.dumps(addresses), "--nbytes", str(nbytes))
    out, _ = sender.communicate(timeout=300)
    if sender.returncode != 0:
        raise RuntimeError(f"the sender on node 0 failed (exit {sender.returncode})")
    return json.loads(out)


def summarise(runs: dict, nbytes: int) -> dict:
    """Medians, the links' rates they imply, both rules' predictions and their errors."""
    alone = {flow: statistics.median(runs[flow]) for flow in FLOWS}
    rates = {flow: nbytes / s for flow, s in alone.items()}
    together = {flow: statistics.median(r[flow] for r in runs["together"]) for flow in FLOWS}
    rules = {
        "byte_fair": predict(rates, nbytes),
        "own_speed_fractions": own_speed_fractions(rates, nbytes),
    }
    return {
        "alone_s": alone,
        "link_rate_MBps": {flow: r / 1e6 for flow, r in rates.items()},
        "together_s": together,
        "predicted_s": rules,
        "error": {rule: {f: p[f] / together[f] - 1 for f in FLOWS} for rule, p in rules.items()},
    }


def run(args: argparse.Namespace) -> int:
    """A node's side (``--receive``, ``--send``: the measurement starts them), or the measurement of
    ``args`` (experiments.link_sharing's command line): exit code 1 where the testbed cannot be built
    or ``--out`` cannot be written."""
    if args.receive is not None:
        receive(args.receive)
        return 0
    if args.send is not None:
        print(json.dumps(send(json.loads(args.send), args.nbytes)))
        return 0
    why = emulation_unavailable()
    if why is not None:
        print(f"error: the emulated testbed is unavailable here: {why}", file=sys.stderr)
        return 1
    try:
        check_writable(os.path.dirname(os.path.abspath(args.out)))
    except ResultsDirError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    nbytes = int(args.mbytes * 1e6)
    result = summarise(measure(args.rate_mbit, nbytes, args.repeats, args.burst_kb), nbytes)
    result["setting"] = {"rate_mbit": args.rate_mbit, "mbytes": args.mbytes, "repeats": args.repeats}
    predicted = result["predicted_s"]
    rows = [
        {
            "flow": flow,
            "alone s": result["alone_s"][flow],
            "together s": result["together_s"][flow],
            "byte-fair s": predicted["byte_fair"][flow],
            "own-speed s": predicted["own_speed_fractions"][flow],
        }
        for flow in FLOWS
    ]
    print(table(rows))
    for rule, errors in result["error"].items():
        print(f"{rule}: " + ", ".join(f"{f} {e:+.1%}" for f, e in errors.items()))
    tmp = f"{args.out}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=2)
    os.replace(tmp, args.out)
    return 0
