"""``import pynvml`` gives the H100 stand-in of tests/fakes/hopper.py, for a whole process.

Put this folder first on PYTHONPATH (and the repository after it) to run a command
(``llmenergy proof``, pytest) against a Hopper GPU whose power follows the process's
CPU use; its settings persist in ``$FAKE_GPU_STATE`` as a driver keeps them.
"""

import sys

from tests.fakes.hopper import build

sys.modules[__name__] = build()
