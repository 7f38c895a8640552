"""The web client in headless Chromium, driven by Playwright: the browser, a signed-in
page, and reading its answers. A module using them imports `browser` (a fixture) and
skips with `needs_chromium` where Debian's Chromium is not installed."""

from __future__ import annotations

import contextlib
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from playwright.async_api import Browser, Locator, Page, async_playwright, expect

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium dials out at start, which a closed
# network refuses.
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Chromium is not installed (`make setup` installs it)"
)
expect.set_options(timeout=20_000)


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=LAUNCH_ARGS)
        yield browser
        await browser.close()


@contextlib.asynccontextmanager
async def signed_in_page(browser: Browser, url: str, api_key: str) -> AsyncIterator[Page]:
    """A fresh browser profile on the page at `url`, signed in with `api_key`; fails on
    any uncaught script error."""
    context = await browser.new_context(viewport={"width": 1280, "height": 800})
    page = await context.new_page()
    errors: list[Exception] = []
    page.on("pageerror", lambda error: errors.append(error))
    try:
        await page.goto(f"{url}/")
        await page.get_by_placeholder("API key").fill(api_key)
        await page.get_by_role("button", name="Sign in").click()
        await expect(page.locator("#app")).to_be_visible()
        yield page
    finally:
        await context.close()
    assert not errors, errors


async def send(page: Page, text: str) -> None:
    await page.locator("#prompt").fill(text)
    await page.locator("#prompt").press("Enter")


def last_answer(page: Page) -> Locator:
    return page.locator(".msg.assistant").last


async def settled(page: Page) -> None:
    """Once the last answer has ended and is shown as stored (it has a seq)."""
    await expect(page.get_by_role("button", name="Send")).to_be_visible()
    await expect(last_answer(page)).to_have_attribute("data-seq", re.compile(r"^\d+$"))


async def answered(page: Page) -> str:
    """The last answer's text, once settled."""
    await settled(page)
    return await last_answer(page).locator(".content").inner_text()
