"""Deciding: which queries go to which system, and what that saves.

- ``profile``: per system and model, the trials at each token size (saved runs or CSV).
- ``workload``: the queries' token counts (Alpaca shipped, or a CSV / JSONL file).
- ``fit``: a query's joules and seconds at any size (interpolated sweeps, fitted model).
- ``optimize``: the best thresholds or token ranges, baselines, lambda sweep, capacities.
- ``policy``: the result as a JSON file a router loads.
- ``plots``: the figures (matplotlib, optional).

The axes a policy routes on live here, so the plugin's options can name them without
importing numpy at every pytest start.
"""

INPUT, OUTPUT, BOTH = "input", "output", "both"
BY_CHOICES = (INPUT, OUTPUT, BOTH)
