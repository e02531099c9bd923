"""jobkit.argtypes: the argparse value types of tb_bridge's command line (the exporter is a click command)."""

import pytest

from jobkit import tb_bridge
from jobkit.argtypes import positive_seconds


@pytest.mark.parametrize("text, expected", [("10", 10.0), ("0.25", 0.25), ("1e-3", 0.001)])
def test_positive_seconds_accepts_numbers_above_zero(text, expected):
    assert positive_seconds(text) == expected


@pytest.mark.parametrize(
    "main, argv",
    [
        (tb_bridge.main, ["serve", "--logdir", "/nonexistent", "--out", "/nonexistent/x.prom", "--interval", "nan"]),
    ],
)
def test_daemons_refuse_a_non_positive_interval_with_a_usage_error(main, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "must be a positive number of seconds, got " + argv[-1] in err
