"""``import pynvml`` gives the fake A100 of tests/fakes/gpu_project.py, for a whole process.

Put this folder first on PYTHONPATH (and the repository after it) to run any command
(pytest, ``llmenergy gpu restore``) against the fake GPU whose settings persist in
``$FAKE_GPU_STATE``: the way the tests try the commands as a user would.  With
``$FAKE_GPU_VENDOR=amd`` the machine is an AMD one: ``import pynvml`` fails, as it
does where nvidia-ml-py is not installed.
"""

import os
import sys

if os.environ.get("FAKE_GPU_VENDOR") == "amd":
    raise ImportError("No module named 'pynvml' (an AMD machine: $FAKE_GPU_VENDOR=amd)")

from tests.fakes.gpu_project import install

sys.modules[__name__] = install("nvidia")
