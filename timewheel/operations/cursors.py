"""The cursor of a listing that pages in the order of one name (``GET /topics``: topic names,
``GET /schedules``: schedule ids): the last name of the page, opaque as ``GET /tasks``'
cursors are (store/listing.py), so that a cursor the listing did not hand out is told from
one it did (a bare name cannot be: every such string is a name)."""

from __future__ import annotations

import base64
import binascii
import re

from timewheel.errors import InvalidInput


class NameCursor:
    """The cursors of ``GET /{listing}``, whose names match ``name_pattern``: base64url
    (unpadded) of ``"{listing}\\n{name}"``."""

    def __init__(self, listing: str, name_pattern: str) -> None:
        self.listing = listing
        self._name = re.compile(name_pattern)

    def encode(self, name: str) -> str:
        """The cursor of the page whose last name is ``name``."""
        return base64.urlsafe_b64encode(f"{self.listing}\n{name}".encode()).decode().rstrip("=")

    def decode(self, cursor: str) -> str:
        """The name ``cursor`` continues after; InvalidInput (422 at the query's ``cursor``)
        for a cursor ``encode`` did not make."""
        refused = InvalidInput(("query", "cursor"), f"not a cursor of GET /{self.listing}", cursor)
        try:
            listing, name = base64.urlsafe_b64decode(
                cursor + "=" * (-len(cursor) % 4)).decode().split("\n")
        except (ValueError, binascii.Error) as exc:
            raise refused from exc
        if listing != self.listing or not self._name.fullmatch(name) or self.encode(name) != cursor:
            raise refused
        return name
