"""Every benchmark in one go; numbers go to bench/out/, tabled by `make docs` (benchmarks page)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def main() -> int:
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    rc = 0
    for script in ("bringup.py", "ecmp_basic.py", "streaming_incident.py", "collective.py",
                   "allreduce_library.py", "ddp_train.py", "gpu_wait.py", "offline.py",
                   "ecnwire.py", "regress.py", "cluster.py", "roce_cpu.py", "roce_incast.py"):
        print(f"== {script}", flush=True)
        rc |= subprocess.run([sys.executable, str(HERE / script), "--json",
                              str(out / script.replace(".py", ".json"))]).returncode
    return rc


if __name__ == "__main__":
    sys.exit(main())
