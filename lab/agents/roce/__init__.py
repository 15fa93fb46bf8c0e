"""The RoCEv2 transport, in C (README.md here), as the lab and its tests build it.

Why here: the sources a program links are one list, named beside the sources, so the lab,
the tests and the benchmark build the same program (``controllers.cbuild.build``).
"""

from __future__ import annotations

from pathlib import Path

DIR = Path(__file__).resolve().parent
#: The wire format, RC queue pairs and DCQCN: what any program on the transport links.
LIBRARY = tuple(DIR / name for name in ("wire.c", "qp.c", "dcqcn.c"))
#: A host around the queue pairs (sockets, the port's pacer, the event loop's wait, JSON
#: pieces): what every program on the transport shares.
HOST = DIR / "host.c"
#: ``roce_bw``, perftest's ``ib_write_bw`` on the transport.
ROCE_BW = (*LIBRARY, HOST, DIR / "roce_bw.c")
#: ``roce_ring``, one rank of a ring All-Reduce on the transport.
ROCE_RING = (*LIBRARY, HOST, DIR / "roce_ring.c")
