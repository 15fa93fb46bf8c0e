"""One app code, two runtimes: the Ryu API from ``os_ken`` or from ``ryu``, chosen by env.

os-ken is the maintained fork; Ryu 4.34 is what most published experiments used. Both
expose the same API under a different package name, so the app imports the names from
here and never names either package. ``FABRICLAB_RUNTIME`` (``os-ken`` or ``ryu``) picks
one; without it, os-ken if it is importable, else Ryu.

Ryu 4.34 on Python 3.11 cannot import ``ryu.app.wsgi`` (it wants ``ALREADY_HANDLED`` from
an eventlet that cannot run on 3.11), and ``ryu.base.app_manager`` imports that module at
the top. The app has no web API, so before touching Ryu we register an inert stand-in under
that name: the real module is never imported, and anything that does need Ryu's web API
fails loudly instead of half-working.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import sys
import types
from typing import Any

from controllers.runtime_select import (
    RUNTIME_ENV,
    RUNTIMES,
    RuntimeUnavailableError,
    package,
    pick,
)


def _no_web_api(name: str) -> types.ModuleType:
    """The inert ``ryu.app.wsgi``: ``start_service`` says there is no web app; anything else
    raises, naming why."""
    mod = types.ModuleType(name, "FabricLab placeholder: Ryu's web API is not available "
                                 "(ryu.app.wsgi does not import on Python 3.11)")

    def start_service(app_mgr: Any) -> None:
        return None

    def __getattr__(attr: str) -> Any:  # noqa: N807 - module-level __getattr__ hook
        raise AttributeError(f"{name}.{attr}: Ryu's web API is disabled in FabricLab "
                             "(ryu.app.wsgi cannot be imported on Python 3.11)")

    mod.start_service = start_service  # type: ignore[attr-defined]
    mod.__getattr__ = __getattr__  # type: ignore[attr-defined]
    mod.FABRICLAB_PLACEHOLDER = True  # type: ignore[attr-defined]
    return mod


RUNTIME_NAME = pick()
_PKG = package(RUNTIME_NAME)

if _PKG == "ryu":
    importlib.import_module("ryu.app")
    sys.modules.setdefault("ryu.app.wsgi", _no_web_api("ryu.app.wsgi"))


def _mod(name: str) -> Any:
    return importlib.import_module(f"{_PKG}.{name}")


hub = _mod("lib.hub")
cfg = _mod("cfg")
app_manager = _mod("base.app_manager")
ofp_event = _mod("controller.ofp_event")
_handler = _mod("controller.handler")
CONFIG_DISPATCHER = _handler.CONFIG_DISPATCHER
MAIN_DISPATCHER = _handler.MAIN_DISPATCHER
DEAD_DISPATCHER = _handler.DEAD_DISPATCHER
set_ev_cls = _handler.set_ev_cls
ofproto_v1_3 = _mod("ofproto.ofproto_v1_3")
packet = _mod("lib.packet.packet")
ethernet = _mod("lib.packet.ethernet")
ipv4 = _mod("lib.packet.ipv4")
tcp = _mod("lib.packet.tcp")
udp = _mod("lib.packet.udp")
icmp = _mod("lib.packet.icmp")

#: The app base class: ``OSKenApp`` in os-ken, ``RyuApp`` in Ryu (same contract).
BaseApp = app_manager.OSKenApp if _PKG == "os_ken" else app_manager.RyuApp
#: Hub flavour: os-ken 4.x runs native threads by default, Ryu eventlet green threads.
HUB_TYPE: str = getattr(hub, "HUB_TYPE", "eventlet")


def _version() -> str:
    try:
        return importlib.metadata.version(RUNTIME_NAME)
    except importlib.metadata.PackageNotFoundError:
        return str(getattr(importlib.import_module(_PKG), "version", "unknown"))


RUNTIME_VERSION = _version()


def register_controller_options() -> None:
    """Import the OpenFlow controller module, which registers ``--ofp-*`` with ``cfg.CONF``
    (they must exist before the command line is parsed)."""
    _mod("controller.controller")


__all__ = ["CONFIG_DISPATCHER", "DEAD_DISPATCHER", "HUB_TYPE", "MAIN_DISPATCHER", "RUNTIMES",
           "RUNTIME_ENV", "RUNTIME_NAME", "RUNTIME_VERSION", "BaseApp", "RuntimeUnavailableError",
           "app_manager", "cfg", "ethernet", "hub", "icmp", "ipv4", "ofp_event", "ofproto_v1_3",
           "packet", "register_controller_options", "set_ev_cls", "tcp", "udp"]
