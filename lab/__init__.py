"""FabricLab: why GPUs and live streams wait for the network, on an emulated fabric.

The packages are layers (ARCHITECTURE.md); this one only says where the tree is.
"""

from pathlib import Path

#: The tree lab/ lives in: scenarios/, controllers/ and the set-up scripts are found from it.
REPO_ROOT = Path(__file__).resolve().parent.parent
