"""Turn the paper's published measurements into a pytest-llmenergy profile CSV.

    python examples/wilkins2024/convert.py > examples/wilkins2024/wilkins2024.csv

Trials are the ``inference`` rows; the warm-up trial (iteration 0) and the start-up rows
(tokenizer, model load) are left out.  Energy is CPU + GPU joules, as the paper sums
them.  Token sizes are the requested ones: the input sweep ran at an output limit of 32
tokens, the output sweep at the prompt's own input length.
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path

HERE = Path(__file__).parent
SWEEPS = {  # file: (sweep, column of the output size)
    "all-input-stats.csv": ("input", "Output Token Limit"),
    "all-output-stats.csv": ("output", "Number of Output Tokens"),
}


def rows() -> list[list[str]]:
    out = []
    for name, (sweep, output_column) in SWEEPS.items():
        with (HERE / name).open(newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                if "inference" not in r["Phase"] or r["Iteration"] == "0":
                    continue
                joules = float(r["CPU Energy (J)"]) + float(r["GPU Energy (J)"])
                out.append(
                    [
                        r["System"],
                        r["Model"],
                        r["Number of Input Tokens"],
                        r[output_column],
                        r["Runtime (s)"],
                        repr(joules),
                        sweep,
                    ]
                )
    return out


def main() -> None:
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(
        ["system", "model", "input_tokens", "output_tokens", "seconds", "joules", "sweep"]
    )
    writer.writerows(rows())


if __name__ == "__main__":
    main()
