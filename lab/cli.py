"""``fabriclab``: list, run, clean, topo, doctor.

Every bad input ends here as one line naming the field and exit status 2, with nothing
started (validation happens before bring-up) or left behind (teardown runs on every path).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from lab.errors import LabError

EXIT_BAD_INPUT = 2


def _cmd_list(_args: argparse.Namespace) -> int:
    from lab import scenario
    for sc in scenario.list_scenarios():
        first = sc.description.splitlines()[0] if sc.description else ""
        print(f"{sc.name:20s} {first}")
    return 0


def _print_summary(out_dir: Path, result: dict) -> None:
    from lab import kinds
    kind = kinds.get(result.get("kind", "ecmp"))
    fid = result["fidelity"]
    print(f"\n{result['scenario']}  policy={result['policy']}  seed={result['seed']}  "
          f"{result['duration_s']:.1f} s  datapath={result['environment']['datapath']}  "
          f"controller={result['environment']['controller']}")
    rows = kind.summary_rows(result)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    print(f"  {'fidelity':<{width}}  {'valid' if fid['valid'] else 'INVALID'} "
          f"(min CPU idle {fid['cpu_idle_min_pct']:.0f}%)"
          + "".join(f"\n  {'':<{width}}  note: {n}" for n in fid["notes"]))
    print(f"  {'result':<{width}}  {out_dir / 'result.json'}")


def _cmd_run(args: argparse.Namespace) -> int:
    from lab import run
    results = run.run(args.scenario, out=Path(args.out) if args.out else None,
                      policy=args.policy, sets=args.set, duration=args.duration,
                      seed=args.seed, runtime=args.controller,
                      progress=lambda msg: print(msg, flush=True))
    for out_dir, result in results:
        result.setdefault("kind", "ecmp")
        _print_summary(out_dir, result)
    return 0


def _cmd_clean(_args: argparse.Namespace) -> int:
    from lab import run, state
    run.require_root()
    dead, alive = state.stale_records()
    for rec in alive:
        print(f"run {rec.run_id} (pid {rec.owner_pid}) is still running: left alone")
    total = {"processes": 0, "bridges": 0, "interfaces": 0}
    for rec in dead:
        removed = state.remove(rec)
        for k, v in removed.items():
            total[k] += v
        print(f"removed run {rec.run_id}: {removed['processes']} processes, "
              f"{removed['bridges']} bridges, {removed['interfaces']} interfaces")
    if not dead:
        print("nothing to clean")
    return 0


def _cmd_topo(args: argparse.Namespace) -> int:
    from lab import environment, run
    from lab.topologies import make_topology
    spec: dict[str, object] = {"type": args.type}
    if args.type == "leafspine":
        spec.update(spines=args.spines, leaves=args.leaves, hosts_per_leaf=args.hosts_per_leaf)
    else:
        spec.update(k=args.k)
    if args.host_bw is not None:
        spec["host_bw"] = args.host_bw
    if args.fabric_bw is not None:
        spec["fabric_bw"] = args.fabric_bw
    topo = make_topology(spec)
    run.policy_names(args.policy)
    run.require_root()
    env = environment.detect(args.controller)
    runtime = environment.pick_runtime(env.runtimes, args.controller)
    with run.fabric_session("topo", topo, env, runtime, args.policy, args.seed) as fabric:
        fabric.start()
        print(f"up in {fabric.timings['ready_s']:.2f} s "
              f"({len(topo.switches())} switches, {len(topo.hosts())} hosts, "
              f"policy {args.policy}, controller {runtime})")
        if args.cli:
            from mininet.cli import CLI
            from mininet.log import setLogLevel
            setLogLevel("output")          # the CLI prints its answers at this level
            CLI(fabric.net)
        else:
            print(f"pingall loss {fabric.pingall():.0f}%")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from lab import diagnose
    result = diagnose.select_phase(diagnose.load_result(args.result), args.phase)
    report = diagnose.diagnose(result)
    print(json.dumps(report, indent=1) if args.json else diagnose.render(report))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from lab import environment
    env = environment.detect(probe_runtimes=False)
    env.runtimes = {name: environment.runtime_version(name) for name in environment.RUNTIMES}
    try:
        env.controller = environment.pick_runtime(env.runtimes, args.controller)
    except LabError as exc:
        env.notes.append(str(exc))
    if args.json:
        print(json.dumps(env.as_dict(), indent=1))
        return 0
    rows = [
        ("kernel", env.kernel),
        ("OVS datapath", f"{env.datapath}" + (" (userspace TSO on)" if env.userspace_tso
                                               else "")),
        ("ECN marking", env.ecn),
        ("delay/loss", env.delay + ("" if env.netem else " (no netem: delay/loss refused)")),
        ("RED qdisc", "yes" if env.red else "no"),
        ("congestion controls", " ".join(env.congestion_controls)
         + ("" if env.dctcp else " (no DCTCP)")),
    ]
    for name, version in env.runtimes.items():
        rows.append((f"runtime {name}", version or "not installed"))
    rows.append(("controller (default)", env.controller or "none"))
    for k, v in rows:
        print(f"{k:22s} {v}")
    for note in env.notes:
        print(f"note: {note}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fabriclab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

    sub.add_parser("list", help="list scenarios").set_defaults(func=_cmd_list)

    r = sub.add_parser("run", help="run a scenario")
    r.add_argument("scenario")
    r.add_argument("--policy", help="hash policy (or 'all'); default from the scenario")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value, e.g. --set traffic.flows=16")
    r.add_argument("--duration", type=float, help="traffic phase in seconds")
    r.add_argument("--seed", type=int)
    r.add_argument("--out", help="result directory (default results/<scenario>-<time>/)")
    r.add_argument("--controller", choices=("os-ken", "ryu"), help="controller runtime")
    r.set_defaults(func=_cmd_run)

    c = sub.add_parser("clean", help="remove what killed runs left behind (by record)")
    c.set_defaults(func=_cmd_clean)

    t = sub.add_parser("topo", help="bring up a fabric (with --cli: Mininet's CLI on it)")
    t.add_argument("type", choices=("leafspine", "fattree"))
    t.add_argument("--spines", type=int, default=2)
    t.add_argument("--leaves", type=int, default=2)
    t.add_argument("--hosts-per-leaf", type=int, default=4)
    t.add_argument("--k", type=int, default=4)
    t.add_argument("--host-bw", type=float)
    t.add_argument("--fabric-bw", type=float)
    t.add_argument("--policy", default="ovs-select")
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--controller", choices=("os-ken", "ryu"))
    t.add_argument("--cli", action="store_true", help="open Mininet's CLI on the fabric")
    t.set_defaults(func=_cmd_topo)

    g = sub.add_parser("diagnose", help="per-flow view of a run: links crossed, where bytes "
                                        "were lost, the congested link")
    g.add_argument("result", help="a run directory or its result.json")
    g.add_argument("--phase", help="a phase of a phased run (default: its incident)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=_cmd_diagnose)

    d = sub.add_parser("doctor", help="what this kernel offers and what the lab will use")
    d.add_argument("--json", action="store_true")
    d.add_argument("--controller", choices=("os-ken", "ryu"))
    d.set_defaults(func=_cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except LabError as exc:
        print(f"fabriclab: error: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("fabriclab: interrupted; everything the run created was removed", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
