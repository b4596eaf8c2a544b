"""``llmenergy route`` and ``llmenergy plot`` as a user runs them: profiles from saved runs
or CSV, workloads, the policy file, and one error line for every kind of bad input."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_llmenergy.routing.policy import load_policy
from tests.casefactory import make_case
from tests.test_cli import HW_A, HW_B, cli, one_error_line, save, usage_error

PAPER = Path(__file__).parents[1] / "examples" / "wilkins2024" / "wilkins2024.csv"
PAPER_ARGS = ("--profile", PAPER, "--system", "M1-Pro", "--system", "Swing AMD+A100")
SIZES = (8, 16, 32, 64, 128, 256)


def _seconds(hardware: str, n: int) -> float:
    """A (10 W) is slow and frugal, B (100 W) fast: 5 + 0.1 n J against 10 + 0.05 n J."""
    return 0.5 + 0.01 * n if hardware == HW_A else 0.1 + 0.0005 * n


def _watts(hardware: str) -> float:
    return 10.0 if hardware == HW_A else 100.0


def _cases(hardware: str) -> list:
    return [
        make_case([_seconds(hardware, n)] * 3, input_tokens=n, watts=_watts(hardware))
        for n in SIZES
    ]


@pytest.fixture
def two_runs(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    save(root, _cases(HW_A), hardware=HW_A)
    save(root, _cases(HW_B), hardware=HW_B)
    return root


@pytest.fixture
def workload(tmp_path: Path) -> Path:
    path = tmp_path / "queries.csv"
    path.write_text("input_tokens,output_tokens\n" + "".join(f"{n},4\n" for n in range(1, 301)))
    return path


def _profile_csv(path: Path) -> Path:
    """The same trials as the two saved runs, as a profile CSV."""
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["system", "model", "input_tokens", "output_tokens", "seconds", "joules"])
        for hw in (HW_A, HW_B):
            for case in _cases(hw):
                for t in case.trials:
                    w.writerow([hw, "tiny-llama", t.input_tokens, 4, t.seconds, t.joules])
    return path


def test_route_between_two_saved_runs(capsys, two_runs: Path, workload: Path) -> None:
    code, out, _ = cli(
        capsys, "--storage", two_runs, "route", "--profile", f"{HW_A}/1",
        "--profile", f"{HW_B}/1", "--workload", workload, "--format", "json",
    )  # fmt: skip
    assert code == 0
    [routed] = json.loads(out)
    rules = routed["policy"]["rules"]
    assert [r["system"] for r in rules] == [HW_A, HW_B]
    # the straight lines cross at 100 tokens; power laws between 64 and 128 near there
    assert 64 <= rules[0]["max_input_tokens"] < 128
    assert routed["totals"]["queries"] == {
        HW_A: rules[0]["max_input_tokens"],
        HW_B: 300 - rules[0]["max_input_tokens"],
    }
    # 5 + 0.1 n and 10 + 0.05 n, so each baseline costs more than the policy
    for b in routed["baselines"][:2]:
        assert b["energy_saving"] > 0
    assert routed["systems"][0]["average_power_w"] == pytest.approx(10.0)


def _route_json(capsys, store: Path, workload: Path, *extra: str) -> dict:
    code, out, err = cli(capsys, "--storage", store, "route", "--profile", f"{HW_A}/1",
                         "--profile", f"{HW_B}/1", "--workload", workload, "--format", "json",
                         *extra)  # fmt: skip
    assert code == 0 and err == ""
    [routed] = json.loads(out)
    return routed


@pytest.mark.parametrize("text", ["400W", "400 W", "400w", "400"])
def test_p_ref_takes_watts_with_or_without_the_unit(
    capsys, two_runs: Path, workload: Path, text: str
) -> None:
    assert _route_json(capsys, two_runs, workload)["p_ref_w"] == 100.0  # B's 100 W, the largest
    assert _route_json(capsys, two_runs, workload, "--p-ref", text)["p_ref_w"] == 400.0


@pytest.mark.parametrize(
    ("p_ref", "crossing"),
    [
        # cost = 0.5 E + 0.5 p_ref T with E_A = 5 + 0.1 n, T_A = 0.5 + 0.01 n,
        # E_B = 10 + 0.05 n, T_B = 0.1 + 0.0005 n (see _seconds):
        # 1 W: 2.75 + 0.055 n = 5.05 + 0.02525 n at n = 2.3 / 0.02975 = 77.3
        ("1W", 77.3),
        # 5 W: 3.75 + 0.075 n = 5.25 + 0.02625 n at n = 1.5 / 0.04875 = 30.8
        ("5W", 30.8),
    ],
)
def test_p_ref_prices_runtime_against_energy(
    capsys, two_runs: Path, workload: Path, p_ref: str, crossing: float
) -> None:
    routed = _route_json(capsys, two_runs, workload, "--lambda", "0.5", "--p-ref", p_ref)
    first = routed["policy"]["rules"][0]
    assert first["system"] == HW_A
    # a whole token below the crossing, from fitted power laws: within 2 tokens of it
    assert crossing - 2 <= first["max_input_tokens"] <= crossing
    # at the default 100 W a second costs so much that B, 5x faster, takes everything
    default = _route_json(capsys, two_runs, workload, "--lambda", "0.5")
    assert default["policy"]["rules"] == [{"system": HW_B}]


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ("inf", "argument --p-ref: expected watts > 0 such as 65 or 65W, got 'inf'"),
        ("nan", "got 'nan'"),
        ("0", "got '0'"),
        ("400kW", "got '400kW'"),
        ("lots", "got 'lots'"),
    ],
)
def test_p_ref_refuses_what_is_not_a_finite_power(capsys, text: str, expect: str) -> None:
    line = usage_error(capsys, "route", "--profile", PAPER, "--p-ref", text)
    assert line.startswith("llmenergy route: error: ") and expect in line


def test_a_profile_csv_gives_the_same_decision(
    capsys, two_runs: Path, workload: Path, tmp_path: Path
) -> None:
    runs = cli(capsys, "--storage", two_runs, "route", "--profile", f"{HW_A}/1",
               "--profile", f"{HW_B}/1", "--workload", workload, "--format", "json")  # fmt: skip
    from_csv = cli(capsys, "route", "--profile", _profile_csv(tmp_path / "p.csv"),
                   "--workload", workload, "--format", "json")  # fmt: skip
    assert runs[0] == from_csv[0] == 0
    a, b = json.loads(runs[1])[0], json.loads(from_csv[1])[0]
    assert a["policy"]["rules"] == b["policy"]["rules"]
    assert a["totals"]["energy_j"] == pytest.approx(b["totals"]["energy_j"])


def test_table_output_of_the_paper_example(capsys) -> None:
    code, out, _ = cli(capsys, "route", *PAPER_ARGS, "--model", "all",
                       "--workload", "alpaca-paper", "--boundaries", "measured")  # fmt: skip
    assert code == 0
    assert "routing all: by input, lambda 1 (energy only), workload alpaca-paper" in out
    assert "0..32" in out and "33 and more" in out
    assert "all on Swing AMD+A100" in out and "+14.32 %" in out
    assert "Pareto front" in out and "energy fit err" in out


def test_policy_file_routes_and_is_never_overwritten(capsys, tmp_path: Path) -> None:
    path = tmp_path / "policy.json"
    code, _, err = cli(capsys, "route", *PAPER_ARGS, "--model", "all",
                       "--workload", "alpaca-paper", "--policy-out", path)  # fmt: skip
    assert code == 0 and f"policy written to {path}" in err
    policy = load_policy(path)
    assert (policy.route(20), policy.route(33), policy.route(34)) == (
        "M1-Pro", "M1-Pro", "Swing AMD+A100",
    )  # fmt: skip
    before = path.read_bytes()
    code, _, err = cli(capsys, "route", *PAPER_ARGS, "--model", "all",
                       "--workload", "alpaca-paper", "--policy-out", path)  # fmt: skip
    assert code == 2 and "exists" in one_error_line(err)
    assert path.read_bytes() == before


def test_lambda_zero_sends_everything_to_the_fast_system(capsys) -> None:
    code, out, _ = cli(capsys, "route", *PAPER_ARGS, "--model", "all", "--lambda", "0",
                       "--workload", "alpaca-paper", "--format", "json")  # fmt: skip
    assert code == 0
    [routed] = json.loads(out)
    assert routed["policy"]["rules"] == [{"system": "Swing AMD+A100"}]


def test_capacity_limits_the_share(capsys) -> None:
    code, out, _ = cli(capsys, "route", *PAPER_ARGS, "--model", "all", "--format", "json",
                       "--workload", "alpaca-paper", "--capacity", "M1-Pro=50%")  # fmt: skip
    assert code == 0
    [routed] = json.loads(out)
    assert routed["totals"]["queries"]["M1-Pro"] <= 26001


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--system", "Nope"), "no measurements of system 'Nope'"),
        (("--model", "GPT"), "model 'GPT' was not measured"),
        (("--model", "all", "--model", "GPT"), "give it alone"),
        ((*PAPER_ARGS[2:], "--model", "Falcon (7B)"), "not measured on M1-Pro"),
        (("--system", "M1-Pro"), "two or more systems"),
        (
            (*PAPER_ARGS[2:], "--capacity", "M1-Pro=0%", "--capacity", "Swing AMD+A100=0%"),
            "capacity",
        ),
        (("--by", "both"), "routes between two systems"),
    ],
)
def test_bad_questions_are_one_line(capsys, args: tuple[str, ...], expect: str) -> None:
    code, out, err = cli(capsys, "route", "--profile", PAPER, *args)
    assert code == 2 and out == ""
    assert expect in one_error_line(err)


def test_a_bad_workload_row_names_its_line(capsys, tmp_path: Path) -> None:
    """--workload is the pytest option --energy-route-workload's row: read as it is parsed."""
    bad = tmp_path / "w.csv"
    bad.write_text("input_tokens,output_tokens\n10,5\n12,x\n")
    line = usage_error(capsys, "route", *PAPER_ARGS, "--workload", bad)
    assert f"argument --workload: {bad}:3: output_tokens" in line
    assert "no such workload" in usage_error(capsys, "route", *PAPER_ARGS, "--workload", "no.csv")


def test_a_bad_profile_row_names_its_line(capsys, tmp_path: Path) -> None:
    bad = tmp_path / "p.csv"
    bad.write_text("system,model,input_tokens,output_tokens,seconds,joules\na,m,8,4,-1,2\n")
    code, _, err = cli(capsys, "route", "--profile", bad)
    assert code == 2 and f"{bad}:2: seconds" in one_error_line(err)


@pytest.mark.parametrize(
    ("args", "expect"),
    [
        (("--lambda", "2"), "argument --lambda: expected a weight of energy between 0 and 1"),
        (("--capacity", "M1-Pro=lots"), "bad capacity"),
        (("--p-ref", "-3"), "argument --p-ref: expected watts > 0"),
        (("--by", "tokens"), "argument --by: expected one of input, output, both"),
        (("--lambda-steps", "1"), "expected 0 (no sweep) or 2 to 1001 steps"),
    ],
)
def test_bad_options_are_usage_errors(capsys, args: tuple[str, ...], expect: str) -> None:
    assert expect in usage_error(capsys, "route", "--profile", PAPER, *args)


def test_route_needs_a_profile(capsys) -> None:
    assert "--profile" in usage_error(capsys, "route")


def test_plot_writes_the_figures(capsys, tmp_path: Path) -> None:
    out_dir = tmp_path / "figs"
    code, out, _ = cli(capsys, "plot", *PAPER_ARGS, "--model", "all", "--workload",
                       "alpaca-paper", "--out", out_dir, "--image-format", "svg",
                       "--lambda-steps", "5")  # fmt: skip
    assert code == 0
    written = [Path(line) for line in out.splitlines()]
    assert written and all(p.parent == out_dir and p.suffix == ".svg" for p in written)
    names = {p.name for p in written}
    assert {"all-workload-vs-threshold.svg", "all-pareto.svg"} <= names
    assert all(p.stat().st_size > 0 for p in written)


def test_plot_of_one_system_draws_its_curves(capsys, two_runs: Path, tmp_path: Path) -> None:
    code, out, _ = cli(capsys, "--storage", two_runs, "plot", "--profile", f"{HW_A}/1",
                       "--out", tmp_path / "one")  # fmt: skip
    assert code == 0
    names = {Path(line).name for line in out.splitlines()}
    assert "tiny-llama-energy-per-token-input.png" in names
    assert not any("pareto" in n for n in names)


def test_the_installed_command_routes(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pytest_llmenergy", "route", *map(str, PAPER_ARGS),
         "--model", "Mistral (7B)", "--workload", "alpaca-paper", "--format", "json"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [routed] = json.loads(done.stdout)
    assert routed["policy"]["rules"][0]["max_input_tokens"] == 32
