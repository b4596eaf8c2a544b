"""Options declared once: flag, ini twin, parser, destination, default; help from registries."""

from __future__ import annotations

import dataclasses

import pytest

from pytest_llmenergy.cli import COMMANDS, _parser
from pytest_llmenergy.figures import FIGURES
from pytest_llmenergy.llm.grid import TINY_MODEL_NAMES
from pytest_llmenergy.meters import BUILTIN_BACKENDS
from pytest_llmenergy.plugin.options import BY_FLAG, OPTIONS, SECTIONS, PluginSettings


def test_every_option_has_one_flag_one_ini_twin_and_a_real_destination() -> None:
    assert len({o.flag for o in OPTIONS}) == len(OPTIONS)
    assert len({o.ini for o in OPTIONS}) == len(OPTIONS)
    assert all(o.ini.startswith("llmenergy_") for o in OPTIONS)
    fields = {f.name: f for f in dataclasses.fields(PluginSettings)}
    for section in SECTIONS:  # each section is a field of PluginSettings, of its own class
        assert fields[section.name].default_factory is section.settings, section.name
        names = {f.name for f in dataclasses.fields(section.settings)}
        for option in section.options:
            assert option.field_name in names, option.to
            assert option.section == section.name and option.settings is section.settings
    assert {s.name for s in SECTIONS} == set(fields) - {"record"}
    assert all(s.settings.__name__.endswith("Settings") for s in SECTIONS)


def test_defaults_come_from_the_settings_not_from_the_help_text() -> None:
    by_flag = {o.flag: o for o in OPTIONS}
    assert by_flag["--energy-max-trials"].default == 25
    assert by_flag["--energy-max-trials"].full_help().endswith("(default: 25)")
    assert (
        by_flag["--energy-ci-target"]
        .full_help()
        .endswith(
            "(default: the rule's: time_s:0.5s and time_s:10% and energy_j:10% for default; "
            "time_s:0.5s for research)"
        )
    )
    assert by_flag["--energy-rule"].default == "default"
    assert by_flag["--energy-max-background"].full_help().endswith("(default: 25%)")
    assert by_flag["--energy-storage"].full_help().endswith("(default: .llmenergy)")


def test_help_lists_choices_from_the_registries(pytester: pytest.Pytester) -> None:
    text = " ".join(pytester.runpytest("--help").stdout.str().split())
    for backend in BUILTIN_BACKENDS:
        assert backend in text
    for model in TINY_MODEL_NAMES:
        assert model in text
    columns = text.split("--energy-columns=LIST", 1)[1].split("--energy-group-by", 1)[0]
    for key in FIGURES:
        assert key.replace("_", "") in columns.replace("_", "").replace(" ", "")
    assert "ini: llmenergy_columns" in text


def test_ini_twins_of_list_options_take_comma_lists(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\nllmenergy_compare_fail = j_per_token:5%, time_s:1s\n")
    pytester.makepyfile(
        """
        def test_x(pytestconfig):
            from pytest_llmenergy.plugin import KEEPER
            gates = pytestconfig.stash[KEEPER].settings.gates
            assert [str(g) for g in gates] == ["j_per_token:5%", "time_s:1s"]
            assert pytestconfig.stash[KEEPER].settings.compare == "latest"
        """
    )
    pytester.runpytest().assert_outcomes(passed=1)


def test_the_renamed_settings_classes_still_import_with_a_warning() -> None:
    import pytest_llmenergy
    from pytest_llmenergy import controller, meters

    with pytest.warns(DeprecationWarning, match="renamed MeterSettings in 0.2.0"):
        assert pytest_llmenergy.MeterOptions is pytest_llmenergy.MeterSettings
    with pytest.warns(DeprecationWarning, match="renamed MeterSettings"):
        assert meters.MeterOptions is meters.MeterSettings
    with pytest.warns(DeprecationWarning, match="renamed ControllerSettings"):
        assert controller.ControllerOptions is controller.ControllerSettings
    with pytest.raises(AttributeError, match="no attribute 'NoSuchName'"):
        pytest_llmenergy.NoSuchName  # noqa: B018


def test_cli_flags_that_mean_a_pytest_option_are_built_from_its_row() -> None:
    """Every command's ``like_options`` become flags with the row's parser and default;
    a flag declared by hand under the same name would make argparse refuse the parser."""
    parser = _parser()
    subparsers = next(a for a in parser._actions if a.dest == "command").choices
    pairs = [(name, *pair) for name, c in COMMANDS.items() for pair in c.like_options]
    assert {("frontier", "--lambda", "--energy-route-lambda")} <= set(pairs)
    for name, flag, option_flag in pairs:
        action = next(a for a in subparsers[name]._actions if flag in a.option_strings)
        row = BY_FLAG[option_flag]
        assert action.dest == row.field_name
        assert action.default == row.default
        assert f"the pytest option {option_flag}" in action.help
    args = parser.parse_args(["frontier", "r", "--lambda", "40%", "--by", "output"])
    assert (args.lam, args.by, args.workload) == (0.4, "output", None)
    assert args.max_slowdowns == BY_FLAG["--energy-max-slowdown"].default == (0.0, 0.05)
    # a repeatable option stays repeatable: its values are parsed together
    args = parser.parse_args(["frontier", "r", "--max-slowdown", "0%", "--max-slowdown", "10%"])
    assert args.max_slowdowns == (0.0, 0.1)


def test_a_bad_value_of_a_repeatable_like_option_is_one_usage_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args(["frontier", "r", "--max-slowdown", "fast"])
    assert stop.value.code == 2
    assert "argument --max-slowdown:" in capsys.readouterr().err.splitlines()[-1]


@pytest.mark.parametrize(
    ("args", "needles"),
    [  # issue 33: hostile values, from the command line and from the ini file
        (["--energy-max-trials=5\nINTERNALERROR> fake"], ["--energy-max-trials=5\\nINTERNALERROR"]),
        (["--energy-seed=" + "9" * 5000], ["expected a whole number >= 0, got '9999"]),
        (["-o", "llmenergy_max_time=1e400"], ["llmenergy_max_time = 1e400 (ini)", "seconds >= 0"]),
        (["-o", "llmenergy_idle=-1"], ["llmenergy_idle = -1 (ini)", "expected seconds >= 0"]),
        (["--energy-cpu-tdp=inf"], ["--energy-cpu-tdp=inf", "expected watts > 0"]),
    ],
)
def test_a_hostile_option_value_is_one_usage_line(
    pytester: pytest.Pytester, args: list[str], needles: list[str]
) -> None:
    from tests.test_plugin import assert_one_line_usage_error

    pytester.makepyfile("def test_x(): pass")
    assert_one_line_usage_error(pytester.runpytest(*args), *needles)


def test_the_help_lists_at_most_80_option_lines_and_says_each_thing_once(
    pytester: pytest.Pytester,
) -> None:
    """Each option earns its place in ``pytest --help`` (issue 55): at most 80 lines start
    with one of ours, and an ini key points to its flag instead of repeating its help."""
    import re

    done = pytester.runpytest_subprocess("--help", "-p", "no:randomly")
    lines = done.stdout.lines
    ours = [line for line in lines if re.match(r"^\s+--(energy|llm)-", line)]
    assert len(ours) <= 80, len(ours)
    at = lines.index(next(line for line in lines if line.strip().startswith("llmenergy_backend (")))
    assert lines[at + 1].strip() == "as --energy-backend (see its help)"
