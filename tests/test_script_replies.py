"""The scripts' coded replies and their enums (timewheel/store/replies.py) say the same thing:
each script's header names its enum and lists exactly its members, and every code the script's
text can return is one of them. The scripts' own tests exercise each reply."""

from __future__ import annotations

import re
from enum import IntEnum

import pytest

from timewheel.store.replies import REPLIES, ScheduleReply
from timewheel.store.scripts import lua_dir

_HEADER = re.compile(r"^-- Reply:.*?\b(\w+Reply)\b")
_DOCUMENTED = re.compile(r"^--\s+(-?\d+) ([A-Z][A-Z_]+)\b")
# Where a literal reply code appears in a script's code: returned, appended to the reply
# list, or kept in the variable that is returned.
_RETURNED = [re.compile(pattern) for pattern in (
    r"\breturn \{?(-?\d+)\b",
    r"\bout\[#out \+ 1\] = (-?\d+)\b",
    r"\bout\[1\] = (-?\d+)\b",
    r"\blocal out = \{(-?\d+)\}",
    r"\breply = (-?\d+)\b",
    r"\bcode = \S+ and (-?\d+) or (-?\d+)\b",
)]
# Scripts whose codes come from a Redis command, not a literal.
_FROM_REDIS = {"flow_limits": {0, 1}}  # EXISTS of the flow's limits hash


def header(text: str) -> tuple[str | None, dict[int, str]]:
    """The enum a script's header names, and the codes it lists under it."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        found = _HEADER.match(line)
        if found:
            listed = {}
            for row in lines[i + 1:]:
                if not row.startswith("--") or row.strip() == "--":
                    break
                code = _DOCUMENTED.match(row)
                if code:
                    listed[int(code.group(1))] = code.group(2)
            return found.group(1), listed
    return None, {}


def returned_codes(text: str) -> set[int]:
    code = "\n".join(line.split("--")[0] for line in text.splitlines())
    return {int(value) for pattern in _RETURNED for match in pattern.finditer(code)
            for value in match.groups()}


@pytest.mark.parametrize("script", sorted(REPLIES))
def test_the_header_lists_the_enum(script: str) -> None:
    enum: type[IntEnum] = REPLIES[script]
    name, listed = header((lua_dir() / f"{script}.lua").read_text())
    assert name == enum.__name__
    assert listed == {member.value: member.name for member in enum}


@pytest.mark.parametrize("script", sorted(REPLIES))
def test_every_code_the_script_returns_is_in_its_enum(script: str) -> None:
    codes = returned_codes((lua_dir() / f"{script}.lua").read_text())
    codes |= _FROM_REDIS.get(script, set())
    assert codes == {member.value for member in REPLIES[script]}


def test_the_checks_see_a_code_missing_from_the_enum() -> None:
    """Control: a script returning a code its enum lacks, or listing another, is caught."""
    text = (lua_dir() / "schedule.lua").read_text()
    assert returned_codes(text.replace("return 2 end", "return 3 end")) != {
        member.value for member in ScheduleReply}
    assert header(text.replace("-1 CONFLICT", "-1 CLASH"))[1] != {
        member.value: member.name for member in ScheduleReply}


def test_every_script_with_codes_has_an_enum() -> None:
    """A script whose header lists codes under a ``...Reply`` name is in REPLIES."""
    named = {path.stem for path in lua_dir().glob("*.lua")
             if header(path.read_text())[0] is not None}
    assert named == set(REPLIES)
