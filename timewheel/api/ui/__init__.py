"""``GET /ui``: the dashboard, static files served by the service itself (docs/api.md, Operations).

The page holds no data, so it needs no token; everything it shows comes from the public API,
called by the browser with the token the user entered (``/stats``, ``/tasks``, ``/flows``,
``/schedules``), so it obeys the tokens exactly as any client does. Plain HTML, CSS and ES
modules from ``static/``, no build step and nothing fetched from elsewhere: it works offline.

- The page is ``/ui`` without a trailing slash and refers to its assets and the API by relative
  URLs (``ui/assets/...``, ``tasks``), so it also works behind a proxy that adds a path prefix.
- Only files that exist in ``static/`` when the app is built are served, by name: no path from
  the request ever reaches the file system.
- A strict Content-Security-Policy (scripts and styles from this origin only, no inline code,
  connections to this origin only): the token sits in session storage, and nothing but this
  page's own code may read it. The scripts put API values into the page as text, never HTML.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, HTTPException
from fastapi.responses import FileResponse, HTMLResponse

from timewheel import __version__

STATIC = Path(__file__).parent / "static"
_TYPES = {
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
    ".png": "image/png",
}
_CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
_HEADERS = {
    "Content-Security-Policy": _CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    # Revalidate every time (a 304 when unchanged): a new version's scripts load at once.
    "Cache-Control": "no-cache",
}


def build_router() -> APIRouter:
    """A router for ``/ui`` and ``/ui/assets/{name}``, over the files in ``static/`` now."""
    router = APIRouter(include_in_schema=False)
    assets = {path.name: path for path in STATIC.iterdir()
              if path.is_file() and path.suffix in _TYPES}
    page = (STATIC / "index.html").read_text(encoding="utf-8").replace("{{version}}",
                                                                       __version__)

    @router.get("/ui", response_class=HTMLResponse)
    async def dashboard() -> HTMLResponse:
        """The dashboard page (no token needed: it holds no data)."""
        return HTMLResponse(page, headers=_HEADERS)

    @router.get("/ui/assets/{name}")
    async def asset(name: str) -> FileResponse:
        """A script, stylesheet or image of the dashboard, by file name."""
        path = assets.get(name)
        if path is None:
            raise HTTPException(status_code=404, detail="no such asset")
        return FileResponse(path, media_type=_TYPES[path.suffix], headers=_HEADERS)

    return router


router = build_router()
