"""FabricLab: a packet-level emulated network lab for why GPUs and live streams wait."""

from setuptools import find_packages, setup

setup(
    name="fabriclab",
    version="0.1.0",
    description="Emulated leaf-spine/fat-tree fabrics on Mininet + OVS with a Ryu-API "
                "ECMP controller, to reproduce network-induced stalls with real packets",
    python_requires=">=3.11",
    packages=find_packages(include=["lab", "lab.*", "controllers", "controllers.*"]),
    package_data={"lab": ["setup.sh", "provision.sh", "packages.txt", "vm_guest.sh",
                          "report/live.html"]},
    install_requires=[
        "os-ken>=4.2",      # maintained Ryu fork; Ryu 4.34 lives in its own venv (lab/setup.sh)
        "PyYAML>=6.0",
        "scapy>=2.5",       # 5-tuple traceroute probes (lab/agents/probe.py)
        "matplotlib>=3.7",  # report.html's plots (lab/report/)
        # One NumPy for matplotlib and Debian's torch 1.13 (python3-torch, the gloo
        # scenarios): torch's NumPy bridge is built for NumPy 1.x and fails under 2.x;
        # matplotlib >= 3.10 wants >= 1.25, newer than Debian's own 1.24.
        "numpy>=1.25,<2",
        "networkx>=3.3",    # the weathermap's graph and tiered layout (lab/plotting/weathermap.py)
        "pytest>=8",        # the `fabric` fixture users import (lab/testing.py)
        # Counters and queues read over rtnetlink in-process, one socket per namespace
        # (lab/measure/telemetry.py): a `tc` spawn per sample ate a slow machine's CPU headroom.
        "pyroute2>=0.9,<0.10",
    ],
    extras_require={"dev": ["ruff>=0.6",
                            "hypothesis>=6.100",      # fuzzed input tests
                            # the layers' contracts (setup.cfg), run by `make lint`
                            "import-linter>=2.1,<3",
                            # the documentation site, built strict by `make docs`
                            "mkdocs>=1.6,<2"]},
    entry_points={"console_scripts": ["fabriclab = lab.cli:main"],
                  # Users' own test suites get the `fabric` fixture without any set-up.
                  "pytest11": ["fabriclab = lab.testing"]},
)
