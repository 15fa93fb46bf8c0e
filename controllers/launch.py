"""Start the FabricLab controller app under os-ken or Ryu, without either's manager command.

``python -m controllers.launch --runtime {os-ken,ryu} --config FILE --ofp-port N [--log FILE]``

Why not ``ryu-manager`` / ``AppManager.run_apps``: Ryu 4.34's both import ``ryu.app.wsgi``,
which cannot be imported on Python 3.11, and os-ken ships no manager command at all. This
does what the managers do, in their order: patch the hub, parse ``cfg.CONF`` (OpenFlow on
127.0.0.1 and the given port only, no config files from the machine), then load,
instantiate and join the app through the ``AppManager``.

SIGTERM/SIGINT close the app manager (which closes the app: its control socket goes away)
and end the process with status 0. The process then ends with ``os._exit``: under os-ken's
native hub the OpenFlow server and connection threads are plain non-daemon threads that
``hub.kill`` cannot stop (it is a no-op there), so a normal interpreter exit would hang.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from controllers import runtime_select

APP = "controllers.fabric_app"
OFP_HOST = "127.0.0.1"
#: Echo every switch each second and drop it after this many unanswered. Not only for hung
#: switches: under os-ken's native hub a connection the switch closed is never noticed
#: otherwise (the connection thread waits forever on its send thread, which ``hub.kill``
#: cannot stop), so the app would never see the switch leave. A failing echo send ends
#: that send thread and the runtime then reports the switch dead within about 2 s.
ECHO_INTERVAL_S = 1.0
ECHO_MAX_UNREPLIED = 10
LOG = logging.getLogger("fabriclab.launch")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m controllers.launch",
                                description="Run the FabricLab ECMP controller.")
    p.add_argument("--runtime", choices=tuple(runtime_select.RUNTIMES), required=True)
    p.add_argument("--config", required=True, help="controller config (JSON, from the lab)")
    p.add_argument("--ofp-port", type=int, required=True,
                   help="OpenFlow TCP port to listen on (on 127.0.0.1 only)")
    p.add_argument("--log", help="log file (default: stderr)")
    p.add_argument("--log-level", default="info",
                   choices=("debug", "info", "warning", "error"),
                   help="debug also logs every per-flow decision")
    args = p.parse_args(argv)
    if not 1 <= args.ofp_port <= 65535:
        p.error(f"--ofp-port: {args.ofp_port} is not a TCP port")
    return args


def setup_logging(path: str | None, level: str) -> None:
    handler: logging.Handler = (logging.FileHandler(path) if path
                                else logging.StreamHandler(sys.stderr))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(getattr(logging, level.upper()))


class _Stopper:
    """Ends the process once, from a signal or from the services ending by themselves."""

    def __init__(self, app_mgr: Any) -> None:
        self.app_mgr = app_mgr
        self._once = threading.Lock()

    def finish(self, code: int, why: str) -> None:
        """Close the app manager and exit; returns at once if another caller is doing so."""
        if not self._once.acquire(blocking=False):
            return
        LOG.info("stopping (%s)", why)
        try:
            self.app_mgr.close()
        except Exception:                     # still exit: the lab is waiting for us
            LOG.exception("closing the app manager failed")
            code = code or 1
        LOG.info("stopped")
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ["FABRICLAB_RUNTIME"] = args.runtime
    os.environ["FABRICLAB_CONTROLLER_CONFIG"] = str(Path(args.config).resolve())
    setup_logging(args.log, args.log_level)

    from controllers import config, policies
    from controllers.policies import remote
    try:
        cfg_file = config.load(args.config)   # fail before anything listens
        if cfg_file.policy_fd is not None:
            policies.set_file_loader(remote.fd_loader(cfg_file.policy_fd))
            policies.resolve(cfg_file.policy)
    except (config.ConfigError, policies.UnknownPolicy, remote.PolicyCallError) as exc:
        LOG.error("%s", exc)
        return 2

    # Patch first, before the rest of the runtime is imported (cheaper, and nothing can
    # have grabbed an unpatched socket or lock yet).
    importlib.import_module(f"{runtime_select.package(args.runtime)}.lib.hub").patch()
    from controllers import runtime
    runtime.register_controller_options()
    runtime.cfg.CONF(args=["--ofp-listen-host", OFP_HOST,
                           "--ofp-tcp-listen-port", str(args.ofp_port)],
                     project=runtime.RUNTIMES[runtime.RUNTIME_NAME],
                     default_config_files=[], default_config_dirs=[])
    runtime.cfg.CONF.set_override("echo_request_interval", ECHO_INTERVAL_S)
    runtime.cfg.CONF.set_override("maximum_unreplied_echo_requests", ECHO_MAX_UNREPLIED)
    LOG.info("%s %s, OpenFlow on %s:%d, config %s (policy %s)", runtime.RUNTIME_NAME,
             runtime.RUNTIME_VERSION, OFP_HOST, args.ofp_port, args.config, cfg_file.policy)

    app_mgr = runtime.app_manager.AppManager.get_instance()
    stopper = _Stopper(app_mgr)

    def on_signal(signum: int, _frame: Any) -> None:
        # Not in the handler itself: under eventlet it runs inside the hub, which must not
        # block; a fresh (green or native) thread may.
        runtime.hub.spawn(stopper.finish, 0, signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        app_mgr.load_apps([APP])
        contexts = app_mgr.create_contexts()
        services = app_mgr.instantiate_apps(**contexts)
    except Exception:
        LOG.exception("the controller app did not start")
        stopper.finish(1, "start-up failed")
        return 1
    runtime.hub.joinall(services)
    stopper.finish(1, "the OpenFlow server ended")
    while True:                               # a signal is already finishing: let it
        runtime.hub.sleep(1)


if __name__ == "__main__":
    sys.exit(main())
