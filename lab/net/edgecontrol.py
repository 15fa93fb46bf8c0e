"""What an operator changes on the edge routers: the ECMP hash, per-flow placement, a cut.

Everything here acts inside the routers' namespaces through their Mininet shells, and asks
the kernel, not a model, what it would do:

* ``set_hash``: ``fib_multipath_hash_policy`` 0 (L3: addresses) or 3 with
  ``fib_multipath_hash_fields`` = the 5-tuple (L4), and ``fib_multipath_hash_seed``. Policy 3,
  not 1: policy 1 takes a packet's socket hash when it carries one, which over veths is
  random per connection (measured: the same 5-tuple took either link on successive
  connections); policy 3 hashes the headers only (the same 5-tuple took one link 6 of 6).
* ``predict``: ``ip route get ... iif ... ipproto sport dport`` is the kernel's own choice
  for a forwarded packet of that 5-tuple, so a seed can be tried without sending a packet.
* ``pin``: per-flow policy routing (``ip rule`` with the 5-tuple into a one-route table):
  placement of elephants by measured load, as a route controller would do.
* ``cut``/``restore``: a silent link failure (nftables drops everything arriving on both
  ends, carrier stays up), so only BFD can notice - as with a failed transceiver or a
  broken path through a transport network.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

HASH_FIELDS_5TUPLE = 0x0037     # src IP, dst IP, IP proto, src port, dst port
HASH_MODES = ("l3", "l4")
CUT_TABLE = "fabriclab_cut"
PIN_TABLE_BASE = 100
PIN_RULE_PRIO = 1000
_SEED_SYSCTL = "/proc/sys/net/ipv4/fib_multipath_hash_seed"


def set_hash(node: Any, mode: str, seed: int) -> dict[str, int | None]:
    """The multipath hash of one router's namespace; returns what the kernel now holds.

    ``seed`` is ``None`` in the answer where the kernel has no ``fib_multipath_hash_seed``
    (Linux before 6.11, e.g. Debian 12's 6.1): there the hash's key is the kernel's own,
    drawn at boot, and cannot be chosen.
    """
    policy = 0 if mode == "l3" else 3
    seedable = node.cmd(f"test -e {_SEED_SYSCTL} && echo yes").strip() == "yes"
    node.cmd(f"sysctl -qw net.ipv4.fib_multipath_hash_policy={policy} "
             f"net.ipv4.fib_multipath_hash_fields={HASH_FIELDS_5TUPLE}"
             + (f" net.ipv4.fib_multipath_hash_seed={seed}" if seedable else ""))
    got: dict[str, int | None] = {"seed": None}
    for key in ("policy", "fields", "seed") if seedable else ("policy", "fields"):
        got[key] = int(node.cmd(f"sysctl -n net.ipv4.fib_multipath_hash_{key}").strip())
    if got["policy"] != policy or (seedable and got["seed"] != seed):
        raise RuntimeError(f"{node.name}: kernel kept hash {got}, wanted policy {policy} "
                           f"seed {seed}")
    return got


@dataclass(frozen=True)
class FiveTuple:
    src: str
    dst: str
    proto: str
    sport: int
    dport: int


def predict(node: Any, iif: str, flows: Iterable[FiveTuple]) -> list[str]:
    """The egress interface the kernel picks for each flow arriving on ``iif``."""
    flows = list(flows)
    batch = "\n".join(f"route get {f.dst} from {f.src} iif {iif} ipproto {f.proto} "
                      f"sport {f.sport} dport {f.dport}" for f in flows)
    out = node.cmd(f"ip -j -batch - <<'EOF'\n{batch}\nEOF")
    devs = []
    for line in out.splitlines():
        # The shell's continuation prompts ("> ") may precede the first answer.
        start = line.find("[{")
        if start >= 0:
            devs += [r.get("dev", "") for r in json.loads(line[start:])]
    if len(devs) != len(flows):
        raise RuntimeError(f"{node.name}: ip route get answered {len(devs)} of {len(flows)}: "
                           f"{out.strip()[:300]}")
    return devs


def pin(node: Any, rules: list[tuple[FiveTuple, str, str]]) -> list[int]:
    """Per-flow routes: each (flow, interface, next hop) gets a rule into its interface's
    table; returns the tables used (``unpin`` takes them)."""
    cmds = []
    tables: dict[str, int] = {}
    for f, intf, via in rules:
        if intf not in tables:
            tables[intf] = PIN_TABLE_BASE + len(tables)
            cmds.append(f"route replace default via {via} dev {intf} table {tables[intf]}")
        cmds.append(f"rule add priority {PIN_RULE_PRIO} from {f.src} to {f.dst} "
                    f"ipproto {f.proto} sport {f.sport} dport {f.dport} table {tables[intf]}")
    batch = "\n".join(cmds)
    # One command line for the shell (Mininet's cmd() returns at the next prompt).
    out = node.cmd(f"ip -batch - <<'EOF'; echo __rc=$?\n{batch}\nEOF")
    if not out.strip().endswith("__rc=0"):
        raise RuntimeError(f"{node.name}: pinning failed: {out.strip()[:300]}")
    return sorted(tables.values())


def unpin(node: Any, tables: list[int]) -> None:
    """Remove every pinned rule (they share one priority) and the given tables."""
    node.cmd(f"while ip rule del priority {PIN_RULE_PRIO} 2>/dev/null; do :; done; "
             + "".join(f"ip route flush table {t}; " for t in tables))


def cut(node: Any, intfs: list[str]) -> None:
    """Drop everything arriving on ``intfs`` of ``node`` (nftables netdev ingress)."""
    chains = "\n".join(f'  chain in{i} {{ type filter hook ingress device "{intf}" '
                       f"priority -500; policy drop; }}" for i, intf in enumerate(intfs))
    out = node.cmd(f"nft -f - <<'EOF'; echo __rc=$?\ntable netdev {CUT_TABLE} {{\n{chains}\n"
                   "}\nEOF")
    if not out.strip().endswith("__rc=0"):
        raise RuntimeError(f"{node.name}: cut failed: {out.strip()[:300]}")


def restore(node: Any) -> None:
    node.cmd(f"nft delete table netdev {CUT_TABLE} 2>/dev/null")

