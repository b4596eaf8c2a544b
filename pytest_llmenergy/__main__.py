"""``python -m pytest_llmenergy``: the same as the ``llmenergy`` command."""

import sys

from .cli import main

sys.exit(main())
