"""Workloads: the shipped Alpaca counts against their documented figures and checksum, and
CSV / JSON-lines files with every bad row named by its line."""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from pathlib import Path

import numpy as np
import pytest

from pytest_llmenergy.routing.profile import ProfileError
from pytest_llmenergy.routing.workload import (
    ALPACA,
    ALPACA_PAPER,
    WorkloadError,
    alpaca,
    load_workload,
)

DATA = resources.files("pytest_llmenergy").joinpath("data")


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


# -- Alpaca --------------------------------------------------------------------------------
def test_alpaca_matches_the_documented_counts_and_sums() -> None:
    """Figures from data/alpaca_token_lengths.md (column sums, row count)."""
    templated, paper = alpaca(), load_workload(ALPACA_PAPER)
    assert len(templated) == len(paper) == 52_002
    assert templated.name == ALPACA and paper.name == ALPACA_PAPER
    assert int(templated.input_tokens.sum()) == 3_203_779
    assert int(templated.output_tokens.sum()) == 3_354_817
    assert int(paper.input_tokens.sum()) == 1_073_667 + 52_002  # raw + one BOS each
    np.testing.assert_array_equal(paper.output_tokens, templated.output_tokens)
    assert templated.input_tokens.dtype == np.int64
    # "Under that count, 88.21% of the examples are <= 32."
    assert round(float(np.mean(paper.input_tokens <= 32)), 4) == 0.8821
    # the templated prompt alone is longer than 32 tokens: min 39
    assert int(templated.input_tokens.min()) == 39
    assert int((templated.output_tokens == 0).sum()) == 28  # 28 empty outputs


def test_alpaca_csv_has_the_documented_checksum() -> None:
    note = DATA.joinpath("alpaca_token_lengths.md").read_text(encoding="utf-8")
    match = re.search(r"CSV SHA-256: `([0-9a-f]{64})`", note)
    assert match, "the provenance note gives the CSV's SHA-256"
    digest = hashlib.sha256(DATA.joinpath("alpaca_token_lengths.csv").read_bytes()).hexdigest()
    assert digest == match[1]


# -- files ---------------------------------------------------------------------------------
def test_csv_workload_reads_the_two_columns_in_any_order(tmp_path: Path) -> None:
    path = write(tmp_path, "queries.csv", "id,output_tokens,input_tokens\na,5,7\n\nb, 0 ,12\n")
    w = load_workload(path)
    assert w.name == "queries.csv" and len(w) == 2
    np.testing.assert_array_equal(w.input_tokens, [7, 12])
    np.testing.assert_array_equal(w.output_tokens, [5, 0])


def test_jsonl_workload(tmp_path: Path) -> None:
    text = (
        '{"input_tokens": 3, "output_tokens": 4, "extra": "x"}\n'
        "\n"
        '{"input_tokens": 0, "output_tokens": 9}\n'
    )
    for name in ("q.jsonl", "q.ndjson", "q.JSON"):
        w = load_workload(write(tmp_path, name, text))
        np.testing.assert_array_equal(w.input_tokens, [3, 0])
        np.testing.assert_array_equal(w.output_tokens, [4, 9])


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("input_tokens,output_tokens\n1,2\n3,x\n", 3, "output_tokens should be a whole"),
        ("input_tokens,output_tokens\n1,2\n\n3.5,1\n", 4, "input_tokens should be a whole"),
        ("input_tokens,output_tokens\n-1,2\n", 2, "input_tokens should be a whole"),
        ("input_tokens,output_tokens\n1,\n", 2, "output_tokens should be a whole"),
        ("input_tokens,output_tokens\n1,\u00b2\n", 2, "output_tokens should be a whole"),
        ("input_tokens,output_tokens\n1,2\n" + "9" * 5000 + ",1\n", 3, "from 0 to 1,000,000,000"),
        ("input_tokens,output_tokens\n1,2\n7\n", 3, "1 values for 2 columns"),
        ("input_tokens\n1\n", 1, "the header lacks output_tokens"),
        ("", 1, "the header lacks input_tokens, output_tokens"),
    ],
)
def test_bad_csv_rows_name_the_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path, "w.csv", text)
    with pytest.raises(WorkloadError, match=re.escape(f"{path}:{line}: ")) as info:
        load_workload(path)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        (
            '{"input_tokens": 1, "output_tokens": 2}\n{"input_tokens": 1.5, "output_tokens": 2}\n',
            2,
            "input_tokens should be",
        ),
        ('{"input_tokens": -1, "output_tokens": 2}\n', 1, "input_tokens should be"),
        ('{"input_tokens": true, "output_tokens": 2}\n', 1, "input_tokens should be"),
        ('{"input_tokens": 1, "output_tokens": null}\n', 1, "output_tokens should be"),
        ('\n{"input_tokens": 1}\n', 2, "an object with input_tokens and output_tokens"),
        ("[1, 2]\n", 1, "an object with input_tokens and output_tokens"),
        ('{"input_tokens": 1, "output_tokens": 2}\n{"input_tokens": 1,\n', 2, "not a JSON object"),
        # issue 33: an OverflowError and a RecursionError traceback before
        ('{"input_tokens": 1' + "0" * 30 + ', "output_tokens": 2}\n', 1, "from 0 to 1,000,000,000"),
        ("[" * 100_000 + "\n", 1, "not an object of two token counts"),
    ],
)
def test_bad_jsonl_rows_name_the_line(tmp_path: Path, text: str, line: int, words: str) -> None:
    path = write(tmp_path, "w.jsonl", text)
    with pytest.raises(WorkloadError, match=re.escape(f"{path}:{line}: ")) as info:
        load_workload(path)
    assert words in str(info.value)


def test_missing_empty_and_unreadable_workloads(tmp_path: Path) -> None:
    missing = str(tmp_path / "nope.csv")
    with pytest.raises(WorkloadError, match=re.escape(f"{missing}: no such workload")):
        load_workload(missing)
    for name, text in (("h.csv", "input_tokens,output_tokens\n\n"), ("e.jsonl", "\n")):
        path = write(tmp_path, name, text)
        with pytest.raises(WorkloadError, match="has no queries"):
            load_workload(path)
    binary = tmp_path / "b.csv"
    binary.write_bytes(b"\xff\xfe\xfa" * 4)
    with pytest.raises(WorkloadError, match="not a text file"):
        load_workload(str(binary))
    with pytest.raises(WorkloadError, match="cannot read"):
        load_workload(str(tmp_path))  # a directory
    assert issubclass(WorkloadError, ProfileError)  # one error family for the CLI
