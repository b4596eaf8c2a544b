"""``python -m pytest_llmenergy``: the same as the ``llmenergy`` command."""

import sys

from .launch import main

sys.exit(main())
