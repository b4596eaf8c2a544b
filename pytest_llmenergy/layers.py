"""The package's layer order, written once: tests/test_layers.py checks every import
against it and the Developing page of the docs shows it.

Lowest first.  A part (a folder, or a top-level module) imports only parts of earlier
layers and its own; parts of one layer do not import each other.
"""

from __future__ import annotations

LAYERS: tuple[tuple[str, ...], ...] = (
    ("errors", "layers"),
    # vendor libraries (pynvml, amdsmi, ...), and the machine's probes: below any meter
    ("gpu", "probes"),
    ("values", "stats", "meters"),
    ("tables", "results", "conversions", "plotting", "sessions", "axes", "commandline"),
    ("figures", "explain", "serving_rules"),
    (
        "case_tables",
        "compare",
        "controller",
        "llm",
        "conditions",
        "distributed",
        "hookspec",
        "leaderboards",
    ),
    ("storage", "serving", "export", "comparison_text"),
    ("routing", "history"),
    ("frontier", "scale", "predict", "gatecheck", "pairing", "check"),
    ("html",),  # the report draws the frontier, routing and scale analyses
    ("__init__",),  # the public API
    ("plugin",),  # the pytest front end
    ("suite",),  # the built-in benchmark suite, which benchmarks/ imports
    ("proof",),  # llmenergy proof: the suite, the meter and the gate on a real GPU
    ("cli",),  # the llmenergy command: its flags that mean a pytest option use that row
    ("launch",),  # its entry point: Ctrl-C while the command's imports run
    ("__main__",),
)

# Module names used twice, on purpose: a deprecated alias keeps its old import path.
SHARED_NAMES: dict[str, str] = {
    "results.py": "controller/results.py is the 0.1 import path of results.py, kept until 0.3",
}
