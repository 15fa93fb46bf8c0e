"""``fabriclab``: list, run, regress, report, compare, clean, topo, diagnose, doctor, vm.

Every bad input ends here as one line naming the field and exit status 2, with nothing
started (validation happens before bring-up) or left behind (teardown runs on every path).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from lab.machine.environment import RUNTIMES
from lab.model.errors import LabError

EXIT_BAD_INPUT = 2


def _cmd_list(_args: argparse.Namespace) -> int:
    from lab.model import scenario
    for sc in scenario.list_scenarios():
        first = sc.description.splitlines()[0] if sc.description else ""
        print(f"{sc.name:20s} {first}")
    return 0


def _print_summary(out_dir: Path, result: dict) -> None:
    from lab import kinds
    kind = kinds.get(result["kind"])
    fid = result["fidelity"]
    print(f"\n{result['scenario']}  policy={result['policy']}  seed={result['seed']}  "
          f"{result['duration_s']:.1f} s  datapath={result['environment']['datapath']}  "
          f"controller={result['environment']['controller']}")
    rows = kind.summary_rows(result)
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    wait = fid.get("datapath_wait_max_ms")
    print(f"  {'fidelity':<{width}}  {'valid' if fid['valid'] else 'INVALID'} ("
          + (f"datapath wait max {wait:.0f} ms/s, " if wait is not None else "")
          + f"min CPU idle {fid['cpu_idle_min_pct']:.0f}%)"
          + "".join(f"\n  {'':<{width}}  note: {n}" for n in fid["notes"]))
    print(f"  {'result':<{width}}  {out_dir / 'result.json'}")


def _cmd_run(args: argparse.Namespace) -> int:
    from lab import grade, run
    # A policy file answers the run's own flows first, in a child with a time limit (what
    # `grade` does): an endless choose() is one line in seconds, not a controller that
    # never programs the switches.
    grade.check_policy_files(run.check_input(args.scenario, policy=args.policy, sets=args.set,
                                             duration=args.duration, seed=args.seed),
                             args.policy)
    if args.dry_run:
        plans = run.make_plans(args.scenario, policy=args.policy, sets=args.set,
                               duration=args.duration, seed=args.seed, runtime=args.controller)
        for plan in plans:
            print(run.expectation_line(plan))
        for line in run.kind_warnings(plans):
            print(line)
        return 0
    results = run.run(args.scenario, out=Path(args.out) if args.out else None,
                      policy=args.policy, sets=args.set, duration=args.duration,
                      seed=args.seed, runtime=args.controller, live=args.live,
                      cluster=args.cluster, progress=lambda msg: print(msg, flush=True))
    for out_dir, result in results:
        _print_summary(out_dir, result)
    return 0


def _policies_wanted(args: argparse.Namespace) -> list[str]:
    """``--policy`` names and ``--policy-file`` paths, in the order given (default hash5)."""
    wanted = list(args.policy or []) + list(args.policy_file or [])
    for spec in args.policy_file or []:
        from controllers import policies
        if not policies.is_file_spec(spec):
            from lab.model.errors import ScenarioError
            raise ScenarioError("policy-file", f"{spec!r} is not a .py file "
                                "(give path/to/file.py or path/to/file.py:ClassName)")
    return wanted or ([] if getattr(args, "variant", None) else ["hash5"])


def _cmd_regress(args: argparse.Namespace) -> int:
    """Run scenarios × seeds per policy; compare with a baseline; exit 1 on a regression."""
    from lab import regress_session
    request = regress_session.Request(
        policies=_policies_wanted(args), scenarios=args.scenarios, trials=args.trials,
        first_seed=args.seed, sets=list(args.set), duration=args.duration,
        baseline=Path(args.baseline) if args.baseline else None,
        update_baseline=args.update_baseline,
        junit=Path(args.junit) if args.junit else None,
        out=Path(args.out) if args.out else None, variants=list(args.variant or []))
    return regress_session.execute(request)


def _cmd_report(args: argparse.Namespace) -> int:
    from lab import report
    path = report.write_report(Path(args.dir))
    print(path)
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    from lab import report
    a, b = Path(args.a), Path(args.b)
    out = Path(args.out) if args.out else a.parent / f"compare-{a.name}-{b.name}.html"
    path = report.write_compare(a, b, out)
    ra, rb = report.load_result(a), report.load_result(b)
    rows = report.compare_rows(ra, rb)
    head = ("metric", f"A ({ra.get('policy')})", f"B ({rb.get('policy')})", "B - A")
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(4)]
    for r in [head, *rows]:
        print("  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    print(path)
    return 0


def _cmd_policy_check(args: argparse.Namespace) -> int:
    from lab.analysis import policycheck
    return policycheck.main_check(args)


def _cmd_cluster(args: argparse.Namespace) -> int:
    """``fabriclab cluster``: set-up and facts of a cluster's workers, and the agent."""
    from lab.machine import state, workers
    from lab.model import cluster
    if args.cluster_command == "facts":
        print(json.dumps(workers.facts()))
        return 0
    state.require_root("fabriclab cluster")
    if args.cluster_command == "agent":
        from lab.measure import agent
        with state.signals_as_exit():
            return agent.serve(args.run_id)
    spec = cluster.load(args.file)
    progress = (lambda msg: print(msg, flush=True))  # noqa: E731
    if args.cluster_command == "setup":
        workers.setup(spec, progress)
    else:
        workers.check(spec, progress)
    return 0


def _cmd_clean(args: argparse.Namespace) -> int:
    from lab.machine import state
    state.require_root()
    if args.cluster:
        from lab.machine import workers
        from lab.model import cluster
        if workers.clean(cluster.load(args.cluster), lambda m: print(m, flush=True)):
            return 1
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
    from lab import run
    from lab.machine import environment, state
    from lab.model.policies import policy_names
    from lab.net.topologies import make_topology
    spec: dict[str, object] = {"type": args.type}
    if args.type == "leafspine":
        spec.update(spines=args.spines, leaves=args.leaves, hosts_per_leaf=args.hosts_per_leaf)
    else:
        spec.update(k=args.k)
    if args.host_bw is not None:
        spec["host_bw"] = args.host_bw
    if args.fabric_bw is not None:
        spec["fabric_bw"] = args.fabric_bw
    if args.mgmt_bw is not None:
        spec["mgmt_bw"] = args.mgmt_bw
    # Planning a split is for fabrics too large for one machine: its size guard is off.
    topo = make_topology(spec, machine_limits=args.workers is None)
    if args.workers is not None:
        # Planning for cluster mode / MaxiNet only: no root needed, nothing is started.
        from lab.analysis.partition import partition, render
        from lab.net.topologies import describe
        desc = describe(topo)
        print(render(partition(desc, args.workers), desc))
        return 0
    policy_names(args.policy)
    state.require_root()
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
            if fabric.mgmt_hosts():
                print(f"management pingall loss {fabric.pingall_mgmt():.0f}%")
    return 0


def _cmd_diagnose(args: argparse.Namespace) -> int:
    from lab.analysis import diagnose, gpuwait
    result = diagnose.select_phase(diagnose.load_result(args.result), args.phase)
    report = diagnose.diagnose(result)
    if "phase_details" in result:   # a collective run's phases with a loader: who waited
        waits = gpuwait.diagnose(result)
        if args.phase is not None:
            waits = {k: v for k, v in waits.items() if k == args.phase}
        if waits:
            report["gpu_wait"] = waits
    print(json.dumps(report, indent=1) if args.json else "\n".join(
        [diagnose.render(report), *gpuwait.render(report.get("gpu_wait") or {})]))
    return 0


def _cmd_doctor(args: argparse.Namespace) -> int:
    from lab.machine import environment
    env = environment.detect(probe_runtimes=False)
    env.runtimes = {name: environment.runtime_version(name) for name in environment.RUNTIMES}
    try:
        env.controller = environment.pick_runtime(env.runtimes, args.controller)
    except LabError as exc:
        env.notes.append(str(exc))
    from lab.kinds.streaming import media
    real_media = {"missing": media.missing_packages(), "browser_viewer": media.browser_ready()}
    if args.json:
        print(json.dumps({**env.as_dict(), "torch": environment.collective_library(),
                          "media": real_media}, indent=1))
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
    lib = environment.collective_library()
    if lib["torch"]:
        rows.append(("torch (gloo scenarios)", f"{lib['torch']}, gloo "
                     + ("yes" if lib["gloo"] else "no") + f", NumPy {lib['numpy']} bridge "
                     + ("ok" if lib["numpy_bridge"] else "broken")))
    else:
        rows.append(("torch (gloo scenarios)", environment.TORCH_MISSING
                     + (f" ({lib['error']})" if lib.get("error") else "")))
    rows.append(("real media", ("missing " + " ".join(real_media["missing"]))
                 if real_media["missing"] else "ffmpeg, nginx-rtmp"))
    rows.append(("browser viewer", "Chromium with hls.js" if real_media["browser_viewer"]
                 else "no (needs chromium-headless-shell and hls.js: make setup)"))
    for k, v in rows:
        print(f"{k:22s} {v}")
    for note in env.notes:
        print(f"note: {note}")
    return 0


def _run_args(args: argparse.Namespace) -> list[str]:
    """``fabriclab run``'s options as given, to hand to the same command elsewhere."""
    out = [args.scenario]
    for flag in ("policy", "duration", "seed", "controller"):
        value = getattr(args, flag)
        if value is not None:
            out += [f"--{flag}", str(value)]
    for item in args.set:
        out += ["--set", item]
    return out


def _cmd_vm(args: argparse.Namespace) -> int:
    import shlex

    from lab import run
    from lab.machine import vm
    progress = (lambda msg: print(msg, flush=True))  # noqa: E731
    try:
        if args.vm_command == "build":
            vm.build(progress, force=args.force)
            return 0
        if args.vm_command == "cluster":
            return _vm_cluster(args, progress)
        if args.vm_command == "shell":
            return vm.shell(Path(args.out) if args.out else run.default_out_dir("vm-shell"))
        if args.vm_command == "exec":
            if args.cmd[:1] == ["--"]:
                args.cmd = args.cmd[1:]
            if not args.cmd:
                from lab.model.errors import ScenarioError
                raise ScenarioError("vm exec", "give a command: fabriclab vm exec -- CMD ...")
            out = Path(args.out) if args.out else None
            return vm.execute(shlex.join(args.cmd), out, progress)
        # run: the same input checks as `fabriclab run`, before anything boots.
        run.check_input(args.scenario, args.policy, args.set, args.duration, args.seed)
        out = Path(args.out) if args.out else run.default_out_dir(args.scenario)
        job = shlex.join(["fabriclab", "run", *_run_args(args), "--out", "/mnt/out",
                          *(["--live"] if args.live else [])])
        # The guest names its results by its own mount and serves the live view on its own
        # loopback: say where they are here.
        seen_here = {"/mnt/out": str(out)}
        forward = None
        if args.live:
            from lab.machine import vmnet
            from lab.report.live import DEFAULT_PORT, HOST
            forward = (vmnet.host_port(DEFAULT_PORT), DEFAULT_PORT)
            seen_here[f"http://{HOST}:{DEFAULT_PORT}/"] = f"http://{HOST}:{forward[0]}/"
        pending = [""]          # whole lines only: a name may arrive split over two reads

        def write(text: str) -> None:
            for guest, here in seen_here.items():
                text = text.replace(guest, here)
            sys.stdout.write(text)
            sys.stdout.flush()

        def sink(text: str) -> None:
            lines, _, pending[0] = (pending[0] + text).rpartition("\n")
            if lines:
                write(lines + "\n")
        try:
            return vm.execute(job, out, progress, sink=sink, forward=forward)
        finally:
            write(pending[0])
    except vm.VmBootError as exc:
        print("\n".join(f"  console: {ln}" for ln in exc.console_tail), file=sys.stderr)
        raise


def _vm_cluster(args: argparse.Namespace, progress: Any) -> int:
    from lab.machine import vmcluster
    if args.vm_cluster_command == "up":
        c = vmcluster.up(args.workers, progress)
        for i, m in enumerate(c.members, 1):
            print(f"{m.name}: {m.address}; ssh from here: fabriclab vm cluster exec "
                  f"--worker {i} -- CMD")
        print(f"head: w1, cluster file there: {vmcluster.GUEST_CLUSTER_FILE}")
        return 0
    if args.vm_cluster_command == "down":
        left = vmcluster.down()
        print(f"vm cluster stopped: {left['processes']} processes")
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    c = vmcluster.VmCluster.load()
    if not 1 <= args.worker <= len(c.members):
        from lab.model.errors import ScenarioError
        raise ScenarioError("worker", f"{args.worker}: 1 to {len(c.members)}")
    line = vmcluster.exec_line(cmd) if cmd else ""
    return c.exec(line, args.worker - 1, tty=not cmd and sys.stdin.isatty()).returncode


def _cmd_grade(args: argparse.Namespace) -> int:
    """Grade one answer (or a folder of them) to a lesson's code exercise on real packets."""
    from lab import grade
    from lab.model.errors import ScenarioError
    if (args.file is None) == (args.batch is None):
        raise ScenarioError("file", "give one FILE, or --batch DIR")
    files = grade.batch_files(Path(args.batch)) if args.batch else [Path(args.file)]
    return grade.execute(files, args.exercise, batch=args.batch is not None,
                         out=Path(args.out) if args.out else None,
                         junit_path=Path(args.junit) if args.junit else None,
                         progress=lambda msg: print(msg, file=sys.stderr, flush=True))


def build_parser() -> argparse.ArgumentParser:
    """``fabriclab``'s commands, each parser built by its own function below."""
    p = argparse.ArgumentParser(prog="fabriclab", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list scenarios").set_defaults(func=_cmd_list)
    _run_parser(sub)
    _regress_parser(sub)
    _report_parsers(sub)
    _topo_parser(sub)
    _vm_parser(sub)
    _cluster_parser(sub)
    gr = sub.add_parser("grade", help="check an answer to a lesson's code exercise on real "
                                      "packets: one line per check (exit 0: all pass)")
    gr.add_argument("file", nargs="?", help="the answer (.py); its EXERCISE line names the "
                                            "exercise")
    gr.add_argument("--batch", metavar="DIR", help="grade every .py file in DIR, then a "
                                                   "summary table")
    gr.add_argument("--exercise", help="the exercise, for a file without an EXERCISE line")
    gr.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    gr.add_argument("--out", help="keep the runs here (default: removed afterwards)")
    gr.set_defaults(func=_cmd_grade)
    d = sub.add_parser("doctor", help="what this kernel offers and what the lab will use")
    d.add_argument("--json", action="store_true")
    d.add_argument("--controller", choices=RUNTIMES)
    d.set_defaults(func=_cmd_doctor)
    return p


Subparsers = Any


def _run_parser(sub: Subparsers) -> None:
    r = sub.add_parser("run", help="run a scenario")
    r.add_argument("scenario")
    r.add_argument("--policy", help="hash policy (or 'all'); default from the scenario")
    r.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a scenario value, e.g. --set traffic.flows=16")
    r.add_argument("--duration", type=float, help="traffic phase in seconds")
    r.add_argument("--seed", type=int)
    r.add_argument("--out", help="result directory (default results/<scenario>-<time>/)")
    r.add_argument("--controller", choices=RUNTIMES, help="controller runtime")
    r.add_argument("--live", action="store_true",
                   help="serve a live view of the links on 127.0.0.1 while it runs "
                        "(the URL is printed at the start)")
    r.add_argument("--cluster", metavar="FILE",
                   help="split the fabric over the machines of this cluster file "
                        "(Mininet's cluster edition; see `fabriclab cluster`)")
    r.add_argument("--dry-run", action="store_true",
                   help="check everything and print the expected fidelity on this machine "
                        "(bench/scale.py's measurements); start nothing")
    r.set_defaults(func=_cmd_run)


def _regress_parser(sub: Subparsers) -> None:
    rg = sub.add_parser("regress", help="run scenarios over seeds per policy and compare "
                                        "with a baseline (exit 1 on a regression)")
    rg.add_argument("--policy", action="append", help="policy name (repeatable)")
    rg.add_argument("--policy-file", action="append", metavar="FILE[:CLASS]",
                    help="a policy class in a .py file (repeatable)")
    rg.add_argument("--variant", action="append", metavar="LABEL=POLICY[,KEY=VALUE...]",
                    help="a policy with --set values of its own, as one more column "
                         "(repeatable), e.g. mptcp=hash5,traffic.proto=mptcp; with two or "
                         "more columns a side-by-side table is printed")
    rg.add_argument("--scenarios", nargs="+", metavar="SCENARIO",
                    help="default: the baseline's, else " + ", ".join(
                        ("ecmp-basic", "ecmp-one-pair", "allreduce-ecmp")))
    rg.add_argument("--trials", type=int, help="seeds per scenario (default: the baseline's "
                                               "seeds, else 5)")
    rg.add_argument("--seed", type=int, default=1, help="first seed (default 1)")
    rg.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    rg.add_argument("--duration", type=float)
    rg.add_argument("--baseline", metavar="FILE", help="baseline JSON to compare with")
    rg.add_argument("--update-baseline", action="store_true",
                    help="write --baseline from this run instead of comparing")
    rg.add_argument("--junit", metavar="FILE", help="also write JUnit XML")
    rg.add_argument("--out", help="results directory (default results/regress-<time>/)")
    rg.set_defaults(func=_cmd_regress)


def _report_parsers(sub: Subparsers) -> None:
    """The commands that read results or policies rather than run anything."""
    rp = sub.add_parser("report", help="(re)generate report.html and plots of a run directory")
    rp.add_argument("dir")
    rp.set_defaults(func=_cmd_report)

    cp = sub.add_parser("compare", help="two runs (e.g. two policies) side by side")
    cp.add_argument("a")
    cp.add_argument("b")
    cp.add_argument("--out", help="compare.html path (default next to A)")
    cp.set_defaults(func=_cmd_compare)

    pc = sub.add_parser("policy-check", help="evaluate a policy offline on synthetic flows "
                                             "(no emulation): buckets, collisions, "
                                             "polarisation")
    pc.add_argument("--policy", default="hash5", help="name or file.py[:Class]")
    pc.add_argument("--flows", type=int, default=8, help="flows per set (elephants at once)")
    pc.add_argument("--ports", type=int, default=4, help="equal-cost ports")
    pc.add_argument("--sets", type=int, default=20000)
    pc.add_argument("--seed", type=int, default=1)
    pc.add_argument("--json", action="store_true")
    pc.set_defaults(func=_cmd_policy_check)
    g = sub.add_parser("diagnose", help="per-flow view of a run: links crossed, where bytes "
                                        "were lost, the congested link")
    g.add_argument("result", help="a run directory or its result.json")
    g.add_argument("--phase", help="a phase of a phased run (default: its incident)")
    g.add_argument("--json", action="store_true")
    g.set_defaults(func=_cmd_diagnose)


def _topo_parser(sub: Subparsers) -> None:
    c = sub.add_parser("clean", help="remove what killed runs left behind (by record)")
    c.add_argument("--cluster", metavar="FILE",
                   help="also on every worker of this cluster file (over ssh)")
    c.set_defaults(func=_cmd_clean)
    t = sub.add_parser("topo", help="bring up a fabric (with --cli: Mininet's CLI on it; "
                                   "with --workers N: only plan its split over N machines)")
    t.add_argument("type", choices=("leafspine", "fattree"))
    t.add_argument("--spines", type=int, default=2)
    t.add_argument("--leaves", type=int, default=2)
    t.add_argument("--hosts-per-leaf", type=int, default=4)
    t.add_argument("--k", type=int, default=4)
    t.add_argument("--host-bw", type=float)
    t.add_argument("--fabric-bw", type=float)
    t.add_argument("--mgmt-bw", type=float, metavar="MBPS",
                   help="add the management network: a second NIC per host on a slow L2 LAN")
    t.add_argument("--policy", default="ovs-select")
    t.add_argument("--seed", type=int, default=1)
    t.add_argument("--controller", choices=RUNTIMES)
    t.add_argument("--cli", action="store_true", help="open Mininet's CLI on the fabric")
    t.add_argument("--workers", type=int, metavar="N",
                   help="start nothing: print how the fabric splits over N machines "
                        "(Mininet cluster mode, MaxiNet): switches and hosts per worker, "
                        "the links that become tunnels and their bandwidth")
    t.set_defaults(func=_cmd_topo)


def _vm_parser(sub: Subparsers) -> None:
    v = sub.add_parser("vm", help="a full-kernel Debian 12 VM on this machine (QEMU): OVS "
                                  "kernel datapath, netem, RED, DCTCP")
    vsub = v.add_subparsers(dest="vm_command", required=True)
    vb = vsub.add_parser("build", help="build the VM image (cached; rebuilt when its inputs "
                                       "change)")
    vb.add_argument("--force", action="store_true", help="rebuild even when cached")
    vr = vsub.add_parser("run", help="run a scenario in the VM on this checkout; results to "
                                     "--out on this machine")
    vr.add_argument("scenario")
    vr.add_argument("--policy")
    vr.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    vr.add_argument("--duration", type=float)
    vr.add_argument("--seed", type=int)
    vr.add_argument("--out", help="result directory on this machine")
    vr.add_argument("--controller", choices=RUNTIMES)
    vr.add_argument("--live", action="store_true",
                    help="serve the run's live view on 127.0.0.1 here (the URL is printed)")
    ve = vsub.add_parser("exec", help="run a command in the VM (in the checkout, after "
                                      "set-up); its output and exit status come back")
    ve.add_argument("--out", help="a folder on this machine the guest sees as /mnt/out")
    ve.add_argument("cmd", nargs=argparse.REMAINDER)
    vs = vsub.add_parser("shell", help="a root shell on the VM's console (for a class)")
    vs.add_argument("--out", help="a folder on this machine the guest sees as /mnt/out")
    vc = vsub.add_parser("cluster", help="several VMs joined by a network only they see: "
                                         "a cluster's workers on this machine")
    vcs = vc.add_subparsers(dest="vm_cluster_command", required=True)
    vcu = vcs.add_parser("up", help="boot the VMs; the first is the head, its cluster file "
                                    "is /etc/fabriclab/cluster.yaml")
    vcu.add_argument("--workers", type=int, default=2, metavar="N")
    vcs.add_parser("down", help="stop the VMs and remove what `up` made")
    vce = vcs.add_parser("exec", help="run a command on a VM over ssh (default: the head)")
    vce.add_argument("--worker", type=int, default=1, metavar="I", help="1 = the head")
    vce.add_argument("cmd", nargs=argparse.REMAINDER)
    v.set_defaults(func=_cmd_vm)


def _cluster_parser(sub: Subparsers) -> None:
    cl = sub.add_parser("cluster", help="the machines a fabric is split over (`fabriclab run "
                                        "--cluster FILE`)")
    csub = cl.add_subparsers(dest="cluster_command", required=True)
    cs = csub.add_parser("setup", help="bring every worker to this checkout (copied over "
                                       "ssh, then lab/provision.sh) and check them")
    cs.add_argument("file", help="the cluster file")
    cc = csub.add_parser("check", help="check every worker: reachable, same lab, not busy")
    cc.add_argument("file", help="the cluster file")
    csub.add_parser("facts", help="this machine's lab, tools and lock, as JSON")
    ca = csub.add_parser("agent", help="(started by a cluster run over ssh) a worker's agent")
    ca.add_argument("run_id")
    cl.set_defaults(func=_cmd_cluster)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from lab.machine import jail
    jail.guard_policy_files()       # a user's policy file never runs with root's rights
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
