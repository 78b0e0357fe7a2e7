"""README.md's Configuration table against timewheel/settings.py and `timewheel --help` /
`timewheel serve --help`: every setting has a row and every row a setting, with the code's
default and allowed range; the help gives the same. Before, the README gave the range of 4
of the 22 bounded settings (TIMEWHEEL_TICK_SECONDS=61 or TIMEWHEEL_CLAIM_BATCH=20000 stopped
the start with nothing in the docs to say so), and the help showed Python reprs as defaults
(`PosixPath('.timewheel')`, `[]`, `None`) and, as the whole program's description, the
docstring of `serve`'s module."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal, get_args, get_origin

import pytest

from timewheel.cli import main
from timewheel.settings import Settings, allowed

README = Path(__file__).resolve().parent.parent / "README.md"


def table() -> dict[str, tuple[str, str]]:
    """README's Configuration table: setting -> (its default cell, its row without backticks
    and with a hyphen for an en dash). A row of several (`A` / `B`) has a default each, or
    one for all."""
    section = README.read_text().split("\n## Configuration\n", 1)[1].split("\n## ", 1)[0]
    rows: dict[str, tuple[str, str]] = {}
    for line in section.splitlines():
        if not line.startswith("| `TIMEWHEEL_"):
            continue
        names_cell, default_cell, _ = (cell.strip() for cell in line.strip("|").split("|", 2))
        names = re.findall(r"`TIMEWHEEL_([A-Z_]+)`", names_cell)
        defaults = [cell.strip().strip("`") for cell in default_cell.split(" / ")]
        if len(defaults) == 1:
            defaults *= len(names)
        row = line.replace("`", "").replace("\N{EN DASH}", "-")
        for name, default in zip(names, defaults, strict=True):
            assert name.lower() not in rows, f"TIMEWHEEL_{name} has two rows"
            rows[name.lower()] = (default, row)
    return rows


def same_default(documented: str, shown: str) -> bool:
    """`1.0` is `1`, `./.timewheel` is `.timewheel`."""
    if documented == shown:
        return True
    try:
        return float(documented) == float(shown)
    except ValueError:
        return Path(documented) == Path(shown)


def states(row: str, bounds: str) -> bool:
    """Whether ``row`` gives ``bounds`` whole (`1-1000` is not in `1-10000`)."""
    return re.search(rf"(?<![\d.]){re.escape(bounds)}(?![\d.])", row) is not None


def test_every_setting_has_a_row_and_every_row_is_a_setting() -> None:
    assert sorted(table()) == sorted(Settings.model_fields)


def test_each_row_gives_the_codes_default_and_range() -> None:
    rows = table()
    for name, info in Settings.model_fields.items():
        default, row = rows[name]
        code = info.default
        shown = ("unset" if code in (None, []) else str(code).lower() if isinstance(code, bool)
                 else str(code))
        assert same_default(default, shown), (name, default, shown)
        if get_origin(info.annotation) is Literal:
            assert set(get_args(info.annotation)) <= set(re.findall(r"\w+", row)), name
        elif allowed(name) is not None:
            assert states(row, str(allowed(name))), (name, allowed(name), row)


@pytest.mark.parametrize(("setting", "value", "problem"), [
    ("TIMEWHEEL_TICK_SECONDS", "61", "tick_seconds: Input should be less than or equal to 60"),
    ("TIMEWHEEL_CLAIM_BATCH", "0", "claim_batch: Input should be greater than or equal to 1"),
    ("TIMEWHEEL_KEY_PREFIX", "a/b", "key_prefix: String should match pattern"),
])
def test_a_value_out_of_its_documented_range_stops_the_start(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], setting: str,
        value: str, problem: str) -> None:
    """README, Configuration: exit status 1, `timewheel: invalid settings:` and a line per
    setting (the range is in the row: the test above)."""
    monkeypatch.setenv(setting, value)
    with pytest.raises(SystemExit) as exit_:
        main(["serve"])
    message = str(exit_.value.code)
    assert message.startswith("timewheel: invalid settings:\n  ")  # sys.exit(str): status 1
    assert problem in message


def help_text(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit):
        main([*argv, "--help"])
    return " ".join(capsys.readouterr().out.split())  # argparse's line wrapping undone


def test_serve_help_gives_the_readme_defaults_and_ranges(
        capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text(["serve"], capsys)
    helps = {name.lower(): (default, bounds) for name, default, bounds in re.findall(
        r"TIMEWHEEL_([A-Z_]+) \(default: ([^;)]*)(?:; ([^)]*))?\)", text)}
    rows = table()
    assert sorted(helps) == sorted(rows)
    for name, (default, bounds) in helps.items():
        assert same_default(rows[name][0], default), (name, rows[name][0], default)
        if bounds and get_origin(Settings.model_fields[name].annotation) is not Literal:
            assert states(rows[name][1], bounds), (name, bounds)


def test_top_level_help_is_about_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    text = help_text([], capsys)
    description = text.split(" positional arguments:", 1)[0]
    assert "``" not in description  # no reST from a module docstring
    assert "timewheel serve" in description and "client" in description
    for command in ("serve", "tasks", "schedules", "flows", "topics", "jobs", "listen", "keys"):
        assert command in text
