"""Which hash policies a name means: ``all``, a registered name, or a user's
``file.py[:Class]``. One check for ``run``, ``regress`` and ``policy-check``, so a bad name
gets the same one-line error everywhere."""

from __future__ import annotations

from controllers import policies
from lab.model.errors import ScenarioError


def policy_names(wanted: str) -> list[str]:
    """The policies ``wanted`` means (``all``, a name, or ``file.py[:Class]``), checked."""
    if wanted == "all":
        return policies.available()
    try:
        policies.resolve(wanted)
    except policies.PolicyFileError as exc:
        raise ScenarioError("policy-file", str(exc).split(": ", 1)[-1]) from None
    except policies.UnknownPolicy as exc:
        raise ScenarioError("policy", str(exc).split(": ", 1)[-1]) from None
    return [wanted]
