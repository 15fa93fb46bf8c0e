"""A ring rank's data loader in the collective kind, without a network: its keys and their
checks, its planned connections, and the step's parts read back from the ranks' records."""

from __future__ import annotations

import pytest

from lab import run
from lab.kinds.collective import plan as kind
from lab.model.errors import ScenarioError
from lab.net.topologies import describe, make_topology

TOPO = {"type": "leafspine", "spines": 2, "leaves": 3, "hosts_per_leaf": 4}


def topo():
    return describe(make_topology(TOPO))


@pytest.mark.parametrize("sets, field", [
    (["loader.enabled=true", "loader.workers=0"], "loader.workers"),
    (["phases.alone.loader.prefetch=0"], "phases.alone.loader.prefetch"),
    (["loader.cpu_ms=-1"], "loader.cpu_ms"),
    (["loader.batch_bytes=0"], "loader.batch_bytes"),
    (["loader.enabled=maybe"], "loader.enabled"),
    # the loader reads from storage hosts: none named is an error, also with storage off
    (["loader.enabled=true", "storage.hosts=[]", "phases.shared.storage.mode='off'",
      "phases.classes.storage.mode='off'"], "storage.hosts"),
    (["storage.hosts=[h99]"], "storage.hosts"),
    # the synthetic ring's ranks are the ones that wait for batches
    (["phases.alone.loader.enabled=true", "job.pattern=incast"], "phases.alone.loader.enabled"),
    (["loader.enabled=true", "job.library=gloo"], "loader.enabled"),
])
def test_bad_loader_input_names_the_field(sets, field):
    with pytest.raises(ScenarioError) as err:
        run.make_plans("allreduce-shared-link", sets=sets)
    assert err.value.field == field, str(err.value)


def test_loader_is_off_unless_asked():
    """Every scenario that does not name the loader runs its ring as before."""
    for pp in kind.check({}, topo()).values():
        assert pp["loader"]["enabled"] is False
    pp = kind.check({"storage": {"hosts": ["h12"]}, "loader": {"enabled": True},
                     "phases": {"a": {}, "b": {"loader": {"workers": 1, "cpu_ms": 80}}}},
                    topo())
    assert pp["a"]["loader"]["workers"] == kind.DEFAULTS["loader"]["workers"]
    assert (pp["b"]["loader"]["workers"], pp["b"]["loader"]["cpu_ms"]) == (1, 80)
    assert pp["b"]["loader"]["enabled"] is True
