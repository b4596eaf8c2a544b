"""A fake powercap tree kept running in its own process: one "node" of a simulated job.

``python -m tests.fakes.serve_powercap ROOT PACKAGE_W DRAM_W`` builds the tree under ROOT
(which must not exist), advances its counters at constant power until killed, and writes
``ROOT/ready`` once readers may start.  Two of them, with different powers, let two
torchrun launches on one machine each see their own node's RAPL, so that the per-node
energies of a run can be checked against power x time.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

from .powercap import FakePowercap, FakeZone
from .trace import PowerTrace


def main(argv: list[str]) -> int:
    root, package_w, dram_w = Path(argv[0]), float(argv[1]), float(argv[2])
    package = FakeZone("package-0", PowerTrace([(1.0, package_w)]))
    dram = FakeZone("dram", PowerTrace([(1.0, dram_w)]))
    tree = FakePowercap(root, {0: (package, [dram])}).start()
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    (root / "ready").write_text("1\n")
    done.wait()
    tree.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
