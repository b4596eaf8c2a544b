"""For tests that press Ctrl-C on a child session."""

from __future__ import annotations

import signal


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` of a child that a test interrupts with SIGINT.  A shell runs
    background jobs with SIGINT ignored, and Python then never installs its
    KeyboardInterrupt handler, so the signal would be lost (CI started in the background
    hung 60 s here); a user's terminal delivers it, so the test restores that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
