"""Paired runs (``llmenergy ab``): two checkouts measured in one stretch of time.

Two sessions of unchanged code differ by 8-18 % per case on a shared machine, while one
session's trials agree to 1-5 %: what two versions share in time cancels only when they
are measured side by side.  ``llmenergy ab BASE HEAD`` starts one pytest session per
checkout and lets exactly one of them run at any moment; inside each case the two
sides' trials alternate in randomized ABBA blocks, and the case stops as soon as the
interval of its head/base ratio decides against the gate.

- ``turns``: the order of the trials and the stopping rule on the paired differences
  (pure functions);
- ``channel``: the one-line JSON messages between a side and the coordinator;
- ``coordinator``: the side of the ``llmenergy ab`` process that decides who runs;
- ``supervision``: the sides' processes: started, served, stopped, signals forwarded;
- ``cli/ab_cli.py``: the command: what each pass measures, progress, the verdict, saves.
The side of each pytest session is ``plugin/ab_side.py``.
"""
