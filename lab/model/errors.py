"""One error type for every kind of bad input, so the CLI can answer it the same way.

A ``LabError`` names the field at fault; the CLI prints it on one line and exits with status 2
before anything is started (or after removing whatever had been started).
"""

from __future__ import annotations

#: Characters ``str.splitlines`` breaks at, each with the escape that shows it instead: a
#: key, value or file name the user typed may hold one, and the error must stay one line.
_LINE_BREAKS = str.maketrans({c: repr(c)[1:-1] for c in "\n\r\v\f\x1c\x1d\x1e\x85\u2028\u2029"})


class LabError(Exception):
    """Bad input or an unusable environment, reported to the user as one clear line."""

    exit_status = 2

    def __init__(self, field: str, message: str) -> None:
        self.field = str(field).translate(_LINE_BREAKS)
        self.message = str(message).translate(_LINE_BREAKS)
        super().__init__(f"{self.field}: {self.message}" if self.field else self.message)


class TopologyError(LabError):
    """A topology that cannot be built (0 spines, k odd, a rate the link model cannot do)."""


class ScenarioError(LabError):
    """An unknown scenario, a malformed scenario file or a bad ``--set``."""


class MachineError(LabError):
    """The machine cannot do what was asked (not root, no OVS, no netem for delay)."""


class BusyError(LabError):
    """Another FabricLab run holds the lab (switch names are fixed, so runs take turns)."""
