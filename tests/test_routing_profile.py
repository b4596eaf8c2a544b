"""Profiles: CSV rows grouped into per-size trials, bad rows named by file and line,
runs turned into profiles, and the choice of systems and models to route on."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from pytest_llmenergy.results import CaseResult
from pytest_llmenergy.routing.profile import (
    ALL_MODELS,
    Point,
    Profile,
    ProfileError,
    pool_models,
    profiles_from_run,
    read_profile_csv,
    select,
)
from tests.casefactory import make_case, make_trials
from tests.test_storage_runfile import sample_run

HEADER = "system,model,input_tokens,output_tokens,seconds,joules"


def write(tmp_path: Path, text: str, name: str = "profile.csv") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def profile(system: str, model: str, *sizes: tuple[int, int], source: str = "") -> Profile:
    """A profile with one trial of 1 s and 10 J at each (input, output) size."""
    points = tuple(Point(i, o, (1.0,), (10.0,)) for i, o in sorted(sizes))
    return Profile(system, model, points, source)


# -- reading a CSV -------------------------------------------------------------------------
def test_rows_are_grouped_per_system_and_model_with_sorted_points_and_means(
    tmp_path: Path,
) -> None:
    """Trials at one size become one point; points sort by (input, output) tokens."""
    path = write(
        tmp_path,
        f"{HEADER}\n"
        "A,m1,64,32,2.0,20.0\n"
        "A,m1,8,32,1.0,10.0\n"
        "A,m1,8,32,3.0,14.0\n"
        "B,m1,8,32,0.5,40.0\n"
        "A,m2,8,16,1.5,9.0\n",
    )
    profiles = {(p.system, p.model): p for p in read_profile_csv(path)}
    assert set(profiles) == {("A", "m1"), ("B", "m1"), ("A", "m2")}
    a1 = profiles[("A", "m1")]
    assert [(p.input_tokens, p.output_tokens) for p in a1.points] == [(8, 32), (64, 32)]
    assert a1.points[0].seconds == (1.0, 3.0) and a1.points[0].joules == (10.0, 14.0)
    assert a1.points[0].trials == 2
    assert a1.points[0].mean_seconds == 2.0 and a1.points[0].mean_joules == 12.0
    assert a1.points[0].sweep == ""
    assert a1.source == str(path)
    assert profiles[("B", "m1")].points[0].mean_joules == 40.0


def test_average_power_is_total_joules_over_total_seconds() -> None:
    """Not the mean of per-point powers: long trials weigh more."""
    p = Profile(
        "A",
        "m",
        (Point(8, 32, (1.0, 3.0), (10.0, 50.0)), Point(64, 32, (6.0,), (20.0,))),
    )
    assert p.average_power_w == pytest.approx((10 + 50 + 20) / (1 + 3 + 6))


def test_sweep_column_labels_points_and_extra_columns_are_ignored(tmp_path: Path) -> None:
    """Columns may come in any order; unknown columns (a richer export) do no harm."""
    path = write(
        tmp_path,
        "note,joules,seconds,sweep,output_tokens,input_tokens,model,system,gpu\n"
        "x,10,1,input,32,8,m,A,h100\n"
        "y,12,1,output,32,8,m,A,h100\n"
        "z,30,2,,64,8,m,A,h100\n",
    )
    (p,) = read_profile_csv(path)
    by_key = {(pt.input_tokens, pt.output_tokens, pt.sweep): pt for pt in p.points}
    # one size measured in two sweeps stays two points (the sweeps are kept apart)
    assert set(by_key) == {(8, 32, "input"), (8, 32, "output"), (8, 64, "")}
    assert by_key[(8, 32, "output")].joules == (12.0,)
    assert by_key[(8, 64, "")].seconds == (2.0,)


def test_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER}\n\nA,m,8,32,1,10\n\n")
    (p,) = read_profile_csv(path)
    assert len(p.points) == 1


@pytest.mark.parametrize(
    ("rows", "line", "words"),
    [
        ("A,m,8,32,1,10\nA,m,x,32,1,10\n", 3, "input_tokens"),
        ("A,m,8,32,1,10\nA,m,8,2.5,1,10\n", 3, "output_tokens"),
        ("A,m,-8,32,1,10\n", 2, "input_tokens"),
        ("A,m,8,-1,1,10\n", 2, "output_tokens"),
        ("A,m,8,32,0,10\n", 2, "seconds"),
        ("A,m,8,32,-1,10\n", 2, "seconds"),
        ("A,m,8,32,1,0\n", 2, "joules"),
        ("A,m,8,32,1,-3\n", 2, "joules"),
        ("A,m,8,32,1,nan\n", 2, "joules"),
        ("A,m,8,32,inf,1\n", 2, "seconds"),
        ("A,m,8,32,1,abc\n", 2, "joules"),
        ("A,m,8,32,1,10\n\nA,m,8,32,1\n", 4, "5 values for 6 columns"),
        ("A,m,8,32,1,10\n,m,8,32,1,10\n", 3, "must not be empty"),
        ("A,,8,32,1,10\n", 2, "must not be empty"),
    ],
)
def test_bad_rows_name_the_file_and_line(tmp_path: Path, rows: str, line: int, words: str) -> None:
    path = write(tmp_path, f"{HEADER}\n{rows}")
    with pytest.raises(ProfileError, match=re.escape(f"{path}:{line}: ")) as info:
        read_profile_csv(path)
    assert words in str(info.value)


def test_bad_sweep_value_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, f"{HEADER},sweep\nA,m,8,32,1,10,input\nA,m,8,32,1,10,both\n")
    with pytest.raises(ProfileError, match=re.escape(f"{path}:3: sweep should be")):
        read_profile_csv(path)


def test_header_missing_a_column_is_line_one(tmp_path: Path) -> None:
    path = write(tmp_path, "system,model,input_tokens,output_tokens,seconds\nA,m,8,32,1\n")
    with pytest.raises(ProfileError, match=re.escape(f"{path}:1: the header lacks joules")):
        read_profile_csv(path)


def test_empty_file_and_header_only_file_fail(tmp_path: Path) -> None:
    """An empty file has no header (line 1); a header alone has no trials."""
    empty = write(tmp_path, "", "empty.csv")
    with pytest.raises(ProfileError, match=re.escape(f"{empty}:1: the header lacks system")):
        read_profile_csv(empty)
    header_only = write(tmp_path, f"{HEADER}\n", "header.csv")
    with pytest.raises(ProfileError, match="no trials"):
        read_profile_csv(header_only)


def test_missing_and_binary_files_are_profile_errors(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        read_profile_csv(tmp_path / "nope.csv")
    binary = tmp_path / "bin.csv"
    binary.write_bytes(b"\xff\xfe\x00\x01" * 10)
    with pytest.raises(ProfileError, match="not a CSV text file"):
        read_profile_csv(binary)


# -- saved runs ----------------------------------------------------------------------------
def test_run_profiles_take_the_hardware_as_system_and_the_model_label() -> None:
    cases = (
        make_case([0.1, 0.3], model="llama", sweep="input", input_tokens=8, output_tokens=32),
        make_case([0.5], model="llama", sweep="output", input_tokens=32, output_tokens=64),
        make_case([0.2], model="phi", sweep="input", input_tokens=8, output_tokens=32, watts=50),
    )
    run = sample_run(cases)
    profiles = {p.model: p for p in profiles_from_run(run)}
    assert set(profiles) == {"llama", "phi"}
    assert {p.system for p in profiles.values()} == {run.hardware}
    llama = profiles["llama"]
    assert [(p.input_tokens, p.output_tokens, p.sweep) for p in llama.points] == [
        (8, 32, "input"),
        (32, 64, "output"),
    ]
    assert llama.points[0].seconds == (0.1, 0.3)
    # make_trials: joules = watts x seconds at 100 W
    assert llama.points[0].joules == pytest.approx((10.0, 30.0))
    assert profiles["phi"].average_power_w == pytest.approx(50.0)
    assert profiles_from_run(run, system="M1-Pro")[0].system == "M1-Pro"


def test_run_cases_without_model_label_group_by_test_function_and_skip_empty_trials() -> None:
    """Unlabelled cases of one test function are the sizes of one model; unmeasured trials
    (0 s or 0 J) would break log-log curves, so they are dropped."""
    unlabelled = [
        make_case([0.2], input_tokens=n, output_tokens=32, sweep="input") for n in (16, 64)
    ]
    plain = [
        CaseResult(**{**c.__dict__, "labels": {"sweep": "sideways", "model": ""}})
        for c in unlabelled
    ]
    broken = make_case([0.2], model="broken", watts=0.0)
    profiles = profiles_from_run(sample_run((*plain, broken)))
    # the test by its node id: two files' same-named tests are two models
    assert [p.model for p in profiles] == [plain[0].nodeid.split("[")[0]]
    assert [pt.input_tokens for pt in profiles[0].points] == [16, 64]
    assert {pt.sweep for pt in profiles[0].points} == {""}  # an unknown sweep is not kept


def test_run_without_measured_trials_fails() -> None:
    case = make_case([0.2], watts=0.0)
    zero_s = CaseResult(**{**make_case([0.1]).__dict__, "trials": make_trials([0.0])})
    with pytest.raises(ProfileError, match="no measured trials"):
        profiles_from_run(sample_run((case, zero_s)))


# -- choosing what to route ----------------------------------------------------------------
def test_select_defaults_to_every_system_and_the_common_models() -> None:
    profiles = [
        profile("A", "m1", (8, 32)),
        profile("A", "m2", (8, 32)),
        profile("B", "m2", (8, 32)),
        profile("B", "m1", (8, 32)),
        profile("C", "m1", (8, 32)),
    ]
    chosen = select(profiles)
    assert list(chosen) == ["m1"]  # m2 lacks C
    assert [p.system for p in chosen["m1"]] == ["A", "B", "C"]
    two = select(profiles, systems=("B", "A"))
    assert list(two) == ["m1", "m2"]
    assert [p.system for p in two["m2"]] == ["B", "A"]  # the order asked for
    assert select(profiles, systems=("A", "B"), models=("m2",)).keys() == {"m2"}


def test_select_errors_say_what_is_wrong() -> None:
    profiles = [profile("A", "m1", (8, 32)), profile("B", "m1", (8, 32))]
    with pytest.raises(ProfileError, match="no measurements of system 'Z'"):
        select(profiles, systems=("A", "Z"))
    with pytest.raises(ProfileError, match="model 'm9' was not measured on A, B"):
        select(profiles, models=("m9",))
    with pytest.raises(ProfileError, match="two or more systems"):
        select(profiles, systems=("A", "A"))
    with pytest.raises(ProfileError, match="two or more systems"):
        select([profile("A", "m1", (8, 32))])
    twice = [*profiles, profile("A", "m1", (16, 32), source="other.csv")]
    with pytest.raises(ProfileError, match="two profiles give system 'A', model 'm1'"):
        select(twice)
    apart = [profile("A", "m1", (8, 32)), profile("B", "m2", (8, 32))]
    with pytest.raises(ProfileError, match="no model was measured on every system"):
        select(apart)


def test_select_all_pools_each_systems_models() -> None:
    """``all``: every model of a system becomes one profile, trials kept apart by size."""
    profiles = [
        profile("A", "m1", (8, 32), (64, 32)),
        profile("B", "m2", (8, 32)),
        profile("A", "m2", (8, 32)),
    ]
    chosen = select(profiles, systems=("B", "A"), models=(ALL_MODELS,))
    assert list(chosen) == [ALL_MODELS]
    b, a = chosen[ALL_MODELS]
    assert (b.system, a.system) == ("B", "A")
    assert a.model == ALL_MODELS
    assert [(p.input_tokens, p.trials) for p in a.points] == [(8, 2), (64, 1)]
    assert pool_models(profiles[:1])[0].points == profiles[0].points


def test_average_power_of_no_trials_is_nan() -> None:
    assert math.isnan(Profile("A", "m", ()).average_power_w)


def test_a_csv_saved_by_excel_with_a_byte_order_mark_loads(tmp_path: Path) -> None:
    path = tmp_path / "bom.csv"
    path.write_bytes(
        b"\xef\xbb\xbfsystem,model,input_tokens,output_tokens,seconds,joules\nA,m,8,4,1,2\n"
    )
    [profile] = read_profile_csv(path)
    assert (profile.system, profile.points[0].mean_joules) == ("A", 2.0)
