"""``import amdsmi`` gives the fake MI300X of tests/fakes/gpu_project.py, for a whole
process whose ``$FAKE_GPU_VENDOR`` is ``amd`` (else it fails, as on a machine without
ROCm): as pynvml.py beside it, for commands run against a fake AMD GPU whose power cap
persists in ``$FAKE_GPU_STATE``.
"""

import os
import sys

if os.environ.get("FAKE_GPU_VENDOR") != "amd":
    raise ImportError("No module named 'amdsmi' (set $FAKE_GPU_VENDOR=amd for the fake)")

from tests.fakes.gpu_project import install

sys.modules[__name__] = install("amd")
