"""The web chat client: one page at `/` and its assets under `/static/` (no build step).

The page is a plain HTML/CSS/JS-modules app in `gateway/static/` that talks to
the native API with the API key the user signs in with; nothing here needs auth.
Only files shipped in that folder are served, by exact name.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from gateway.errors import ApiError

STATIC_DIR = Path(__file__).parent / "static"

_MEDIA_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
_ASSETS = {p.name: p for p in STATIC_DIR.iterdir() if p.suffix in _MEDIA_TYPES}

# The page runs only its own scripts and talks only to this origin; answers are
# sanitised before rendering, and the policy is the second line of defence. The page's
# forms never submit (their scripts send with fetch), so no form may: one slipped into
# an answer cannot post anywhere.
_PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; object-src 'none'; frame-src 'none'; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}

router = APIRouter(include_in_schema=False)


@router.get("/")
async def page() -> FileResponse:
    return _file(_ASSETS["index.html"])


@router.get("/static/{name}")
async def asset(name: str) -> FileResponse:
    path = _ASSETS.get(name)
    if path is None:
        raise ApiError(404, "not_found", f"no asset {name!r}")
    return _file(path)


def _file(path: Path) -> FileResponse:
    return FileResponse(path, media_type=_MEDIA_TYPES[path.suffix], headers=_PAGE_HEADERS)
