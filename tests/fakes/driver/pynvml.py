"""``import pynvml`` gives the fake A100 of tests/fakes/gpu_project.py, for a whole process.

Put this folder first on PYTHONPATH (and the repository after it) to run any command
(pytest, ``llmenergy gpu restore``) against the fake GPU whose settings persist in
``$FAKE_GPU_STATE``: the way the tests try the commands as a user would.
"""

import sys

from tests.fakes.gpu_project import install

sys.modules[__name__] = install()
