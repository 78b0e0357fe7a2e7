"""Scopes of API tokens (docs/api.md v3, "Scoped tokens"): ``read`` < ``write`` < ``admin``.

A ``TIMEWHEEL_API_TOKENS`` entry is ``read:<token>``, ``write:<token>``, ``admin:<token>`` or a
bare ``<token>`` (``admin``, the v2 meaning). An entry whose text holds a ``:`` but does not start
with a known scope is refused at start-up rather than taken as a bare admin token: a mistyped
scope (``raed:abc``) must never quietly grant everything. A token that itself contains ``:`` is
written with its scope spelled out (``admin:abc:def`` is the token ``abc:def``).
"""

from __future__ import annotations

import enum

from pydantic import SecretStr


class Scope(enum.Enum):
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"

    @property
    def rank(self) -> int:
        """1, 2, 3: a token's scope covers every scope of a lower or equal rank."""
        return _ORDER.index(self) + 1

    def covers(self, needed: Scope) -> bool:
        return self.rank >= needed.rank

    @classmethod
    def of_rank(cls, rank: int) -> Scope:
        return _ORDER[rank - 1]


_ORDER = (Scope.READ, Scope.WRITE, Scope.ADMIN)
_BY_NAME = {scope.value: scope for scope in Scope}


class ApiToken(SecretStr):
    """One ``TIMEWHEEL_API_TOKENS`` entry: ``get_secret_value()`` is the entry as written,
    ``bearer`` what a client presents, ``scope`` what it may do. Parsed leniently here (pydantic
    builds it); ``problem`` says what is wrong with it, and the settings refuse it at start-up."""

    def __init__(self, secret_value: str) -> None:
        super().__init__(secret_value)
        prefix, colon, rest = secret_value.partition(":")
        self.problem: str | None = None
        if not colon:
            self.scope, self._bearer = Scope.ADMIN, secret_value
        elif prefix in _BY_NAME:
            self.scope, self._bearer = _BY_NAME[prefix], rest
            if not rest:
                self.problem = f"no token after its scope {prefix!r}"
        else:
            # The prefix is not echoed: it may be part of a token that contains ':'.
            self.scope, self._bearer = Scope.ADMIN, secret_value
            self.problem = ("an unknown scope before its ':' (scopes: read, write, admin; a bare "
                            "token is admin; a token that contains ':' is written with its "
                            "scope, e.g. admin:<token>)")

    @property
    def bearer(self) -> bytes:
        """The token a client sends as ``Authorization: Bearer <token>``."""
        return self._bearer.encode()


def check_tokens(tokens: list[ApiToken]) -> list[ApiToken]:
    """Refuse a malformed entry and a token listed twice with different scopes; the message
    names entries by position, never by their text."""
    seen: dict[bytes, tuple[int, Scope]] = {}
    for position, token in enumerate(tokens, start=1):
        if token.problem:
            raise ValueError(f"entry {position} has {token.problem}")
        first = seen.setdefault(token.bearer, (position, token.scope))
        if first[1] is not token.scope:
            raise ValueError(f"entries {first[0]} and {position} are the same token with "
                             f"different scopes ({first[1].value}, {token.scope.value})")
    return tokens
