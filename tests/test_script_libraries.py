"""How a script's ``-- lib:`` libraries are sent (timewheel/store/scripts.py): each library's
top level is definitions only, and a script gets exactly the definitions it uses, directly or
through another one, before its own text; every script still loads and runs in Redis."""

from __future__ import annotations

import hashlib
import re

import pytest
from redis.asyncio import Redis

from timewheel.store import layout
from timewheel.store.scripts import _names, definitions, lua_dir, source

LIBS = sorted(path.stem for path in (lua_dir() / "lib").glob("*.lua"))
SCRIPTS = sorted(path.stem for path in lua_dir().glob("*.lua"))
_DEFINED = re.compile(r"^local\s+(?:function\s+(\w+)|([\w\s,]+?)\s*=)", re.MULTILINE)


def _defined(code: str) -> set[str]:
    return {name.strip() for one, many in _DEFINED.findall(code)
            for name in (one or many).split(",")}


def _libs_of(name: str) -> list[str]:
    first = (lua_dir() / f"{name}.lua").read_text().partition("\n")[0]
    if not first.startswith("-- lib:"):
        return []
    return [lib.strip() for lib in first.removeprefix("-- lib:").split(",") if lib.strip()]


@pytest.mark.parametrize("lib", LIBS)
def test_a_library_is_its_definitions_and_nothing_else(lib: str) -> None:
    text = (lua_dir() / "lib" / f"{lib}.lua").read_text()
    chunks = definitions(text)
    assert chunks
    # Nothing is lost but the comments after the last definition.
    assert text.startswith("".join(body for _, body in chunks))
    assert all(line.startswith("--") or not line.strip()
               for line in text[len("".join(body for _, body in chunks)):].splitlines())


def test_a_blank_line_inside_a_definition_keeps_it_whole() -> None:
    chunks = definitions("-- one\nlocal function f()\n  local a = 1\n\n  return a\nend\n"
                         "\nlocal B = 2\n")
    assert [sorted(names) for names, _ in chunks] == [["f"], ["B"]]
    assert chunks[0][1] == "-- one\nlocal function f()\n  local a = 1\n\n  return a\nend\n"


def test_code_at_a_librarys_top_level_is_refused() -> None:
    with pytest.raises(ValueError, match="not a definition"):
        definitions("local function f() return 1 end\nredis.call('DEL', 'x')\n")


@pytest.mark.parametrize("name", [n for n in SCRIPTS if _libs_of(n)])
def test_a_script_gets_every_library_definition_it_uses_and_only_those(name: str) -> None:
    own = (lua_dir() / f"{name}.lua").read_text()
    sent = source(name)
    assert sent.endswith(own)
    libs_sent = sent[: -len(own)]
    offered = set().union(*(_defined((lua_dir() / "lib" / f"{lib}.lua").read_text())
                            for lib in _libs_of(name)))
    # Every library name the sent code uses is defined in what is sent...
    used = _names(sent) & offered
    assert used <= _defined(libs_sent), used - _defined(libs_sent)
    # ... and every definition sent is used by something else that is sent.
    for names, body in definitions(libs_sent):
        rest = sent.replace(body, "", 1)
        assert names & _names(rest), f"{sorted(names)} is sent but not used"


def test_shaking_drops_definitions_a_script_does_not_use() -> None:
    """The control of the test above: start uses few of record.lua's definitions."""
    full = "".join((lua_dir() / "lib" / f"{lib}.lua").read_text() for lib in _libs_of("start"))
    assert "local function put_with_err" in full
    assert "local function put_with_err" not in source("start")
    assert len(source("start")) < len(full) + len((lua_dir() / "start.lua").read_text())


@pytest.mark.parametrize("name", SCRIPTS)
async def test_every_script_loads_in_redis(redis: Redis, name: str) -> None:
    sha = await redis.script_load(source(name))
    assert await redis.script_exists(sha) == [True]


def _digest_inputs() -> list[str]:
    """Texts whose SHA-1 starts with a zero byte and with 0xff, and a few plain ones: the Lua
    digest packs its 12 hex digits as a 48-bit number, which must keep leading zeros."""
    wanted = {"00": None, "0000": None, "ff": None, "ffff": None}
    n = 0
    while any(found is None for found in wanted.values()):
        text = f"token-{n}"
        hex_digest = hashlib.sha1(text.encode()).hexdigest()
        for start, found in wanted.items():
            if found is None and hex_digest.startswith(start):
                wanted[start] = text
        n += 1
    return [text for text in wanted.values() if text is not None] + ["", "tok", "é" * 40]


async def test_the_lua_digest_is_the_stores_digest(redis: Redis) -> None:
    record = (lua_dir() / "lib" / "record.lua").read_text()
    code = "".join(body for names, body in definitions(record) if "digest" in names)
    sha = await redis.script_load(code + "return digest(ARGV[1])")
    for text in _digest_inputs():
        assert await redis.evalsha(sha, 0, text) == layout.digest(text), text
