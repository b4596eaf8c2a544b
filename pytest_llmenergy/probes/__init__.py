"""Probes of the machine that are not meters: what else runs on it (``background``,
``process_tree``), how fast it runs right now (``reference``), and what a case used
besides energy (``resources``).  Meters and the stopping rule read them; they read
nothing of the package above ``errors``."""
