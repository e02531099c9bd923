"""jobkit.core.clitypes: one finite, range-checked click type per kind of number, and the env setting reader."""

import click
import pytest
from click.testing import CliRunner

from jobkit.core import clitypes


def run(param_type, value):
    @click.command()
    @click.option("--x", type=param_type)
    def cmd(x):
        click.echo(repr(x))

    return CliRunner().invoke(cmd, ["--x", value])


@pytest.mark.parametrize(
    "param_type",
    [clitypes.SECONDS, clitypes.Seconds(0, 600, min_open=False), clitypes.Positive("number of GB"), clitypes.Percent()],
)
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "1e400", "abc", ""])
def test_non_finite_and_garbage_are_usage_errors(param_type, value):
    result = run(param_type, value)
    assert result.exit_code == 2
    assert "Invalid value for '--x'" in result.output


def test_in_range_values_pass_and_bounds_hold():
    assert run(clitypes.SECONDS, "2.5").output.strip() == "2.5"
    assert run(clitypes.SECONDS, "0").exit_code == 2
    assert run(clitypes.SECONDS, str(clitypes.WEEK + 1)).exit_code == 2
    assert run(clitypes.Seconds(0, 600, min_open=False), "0").output.strip() == "0.0"
    assert run(clitypes.Percent(), "100").output.strip() == "100.0"
    assert run(clitypes.Percent(), "100.5").exit_code == 2
    assert run(clitypes.Positive("TGS", max=10), "11").exit_code == 2


@pytest.mark.parametrize(("raw", "value"), [(None, 3), ("", 3), ("0", 0), ("007", 7), ("123456789", 123456789)])
def test_env_uint_reads_what_setting_uint_reads(raw, value):
    env = {} if raw is None else {"N": raw}
    assert clitypes.env_uint(env, "N", 3) == value


@pytest.mark.parametrize("raw", ["abc", "-1", "+1", "1.0", " 1", "1234567890", "١"])
def test_env_uint_refuses_anything_else_in_one_line(raw):
    with pytest.raises(clitypes.SettingError) as exc:
        clitypes.env_uint({"N": raw}, "N", 3)
    assert str(exc.value) == f"N={raw!r} is not a whole number of 1 to 9 digits; set it to one (e.g. N=3) or unset it"


@pytest.mark.parametrize(
    "argv",
    [
        ["monitor", "--once", "--interval"],
        ["hang-watchdog", "--check", "--interval"],
        ["reap", "--grace"],
        ["ray-launch", "--grace"],
        ["ray-launch", "--nodes-timeout"],
        ["ray-launch", "--connect-timeout"],
        ["exporter", "--interval"],
    ],
)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_every_seconds_option_refuses_non_finite(tmp_path, argv, value):
    from jobkit.cli import main

    result = CliRunner().invoke(main, [*argv, value, "--", "true"], env={"JOB_WORKSPACE": str(tmp_path)})
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{argv[-1]}'" in result.output
