// The chat view: the selected thread of one conversation, the composer, and the
// turn being answered (streamed from the native SSE API).
import { ApiError, routes } from "./api.js";
import { duration, el, icon } from "./dom.js";
import { renderMessage } from "./message.js";
import { threadItems } from "./thread.js";

const SETTLE_TIMEOUT_MS = 6000;
// A broken-off answer is followed again after 0.5, 1, 2, 4, 4 … s, for up to 30 s
// without a new event.
const RESUME_FIRST_WAIT_MS = 500;
const RESUME_MAX_WAIT_MS = 4000;
const RESUME_TIMEOUT_MS = 30_000;

export class ChatView {
  /** hooks: model() -> model id, created(conversation), turnStarted(cid), turnEnded(cid),
   * unauthorized() */
  constructor(root, api, hooks) {
    this.api = api;
    this.hooks = hooks;
    this.scroller = root.querySelector("#messages");
    this.column = root.querySelector("#thread");
    this.empty = root.querySelector("#empty");
    this.title = root.querySelector("#chat-title");
    this.form = root.querySelector("#composer");
    this.input = root.querySelector("#prompt");
    this.button = root.querySelector("#send");
    this.banner = root.querySelector("#banner");
    this.cid = null;
    this.items = [];
    this.live = null;
    this.notes = new Map(); // message id -> {routed, retracted, error, lost, rating}: what the store does not keep
    this.form.addEventListener("submit", (event) => {
      event.preventDefault();
      if (this.live) this.stop();
      else this.submit();
    });
    this.input.addEventListener("keydown", (event) => {
      if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
        event.preventDefault();
        if (!this.live) this.submit();
      }
    });
    this.input.addEventListener("input", () => this.fitInput());
    this.setBusy(false);
  }

  // --- loading ------------------------------------------------------------------------

  async open(cid) {
    if (this.live) this.stop();
    this.cid = cid;
    this.items = [];
    this.hideBanner();
    if (cid === null) {
      this.title.textContent = "New chat";
      this.render();
      this.input.focus();
      return;
    }
    try {
      await this.load();
    } catch (error) {
      this.failed(error);
    }
  }

  async load() {
    const cid = this.cid;
    const detail = await this.api.json("GET", routes.conversation(cid));
    if (cid !== this.cid || this.live) return detail;
    this.title.textContent = detail.title || "New chat";
    this.items = threadItems(detail);
    this.render();
    return detail;
  }

  /** After a turn: the stored thread once the store has the end of `messageId` (an answer
   * is stored `in_progress` while it streams), or as it stands after SETTLE_TIMEOUT_MS. */
  async settle(cid, messageId) {
    const deadline = Date.now() + SETTLE_TIMEOUT_MS;
    while (cid === this.cid && !this.live) {
      const detail = await this.api.json("GET", routes.conversation(cid)).catch(() => null);
      const stored = detail?.messages.find((m) => m.message_id === messageId);
      const ended = stored && stored.status !== "in_progress";
      if (detail && (ended || !messageId || Date.now() > deadline)) {
        if (cid === this.cid && !this.live && (stored || !messageId)) {
          this.title.textContent = detail.title || "New chat";
          this.items = threadItems(detail);
          this.render();
        }
        return;
      }
      await new Promise((resolve) => setTimeout(resolve, 200));
    }
  }

  // --- turns --------------------------------------------------------------------------

  async submit() {
    const content = this.input.value.trim();
    if (!content || this.live) return;
    this.input.value = "";
    this.fitInput();
    if (this.cid === null) {
      try {
        const conversation = await this.api.json("POST", routes.newConversation(), {});
        this.cid = conversation.conversation_id;
        this.hooks.created(conversation);
      } catch (error) {
        this.input.value = content;
        this.failed(error);
        return;
      }
    }
    const user = { role: "user", content, pending: true, siblings: [], index: 0 };
    await this.turn({
      path: routes.messages(this.cid),
      body: { content },
      keep: this.items,
      user,
      draft: content,
    });
  }

  regenerate(item) {
    const at = this.items.indexOf(item);
    return this.turn({ path: routes.regenerate(this.cid, item.message_id), body: {},
      keep: this.items.slice(0, at) });
  }

  /** Another answer to user message `item`, the one before it in the thread. */
  retry(item) {
    const at = this.items.indexOf(item);
    const question = this.items[at - 1];
    return this.turn({ path: routes.regenerate(this.cid, question.message_id), body: {},
      keep: this.items.slice(0, at) });
  }

  edit(item, content) {
    const at = this.items.indexOf(item);
    const user = { role: "user", content, pending: true, siblings: [], index: 0 };
    return this.turn({ path: routes.edit(this.cid, item.message_id), body: { content },
      keep: this.items.slice(0, at), user });
  }

  async select(item, step) {
    const target = item.siblings[item.index + step];
    if (!target || this.live) return;
    try {
      const detail = await this.api.json("POST", routes.select(this.cid, target));
      this.items = threadItems(detail);
      this.render();
    } catch (error) {
      this.failed(error);
    }
  }

  /** Rate answer `item` ("up" or "down"): sent to chat.feedback through the gateway. */
  async rate(item, rating) {
    try {
      await this.api.json("POST", routes.feedback(item.message_id), { rating });
      this.notes.set(item.message_id, { ...this.notes.get(item.message_id), rating });
      this.paint(item);
    } catch (error) {
      this.failed(error);
    }
  }

  /** Stop the answer: ask the gateway to cancel it, drop the stream and stop reconnecting. */
  stop() {
    const live = this.live;
    if (!live) return;
    live.stopped = true;
    live.item.queue = null;
    live.item.status = live.item.status ?? "finished_aborted";
    if (live.requestId) this.api.send("POST", routes.cancel(live.requestId)).catch(() => {});
    live.controller.abort();
    this.paint(live.item);
  }

  async turn({ path, body, keep, user = null, draft = null }) {
    if (this.live) return;
    const cid = this.cid;
    const item = { role: "assistant", content: "", pending: true, streaming: true,
      siblings: [], index: 0 };
    const live = { controller: new AbortController(), item, user, requestId: null,
      messageId: null, lastEventId: null, ended: false, stopped: false };
    this.live = live;
    this.items = [...keep, ...(user ? [user] : []), item];
    this.hideBanner();
    this.render();
    this.setBusy(true);
    this.scrollToEnd(true);
    let refused = null;
    try {
      const model = this.hooks.model();
      const events = this.api.stream(path, model ? { ...body, model } : body, live.controller.signal);
      await this.read(live, events).catch((error) => {
        if (error instanceof ApiError) refused = error;
      });
      if (!refused && !live.ended && !live.stopped) await this.resume(live);
    } finally {
      item.streaming = false;
      this.live = null;
      this.setBusy(false);
    }
    if (cid !== this.cid) return;
    if (refused) {
      if (draft !== null && !this.input.value) this.input.value = draft;
      this.fitInput();
      this.failed(refused, () => this.turn({ path, body, keep, user, draft }));
      await this.load().catch(() => {});
    } else {
      this.paint(item);
      await this.settle(cid, live.messageId);
    }
    this.hooks.turnEnded(cid);
  }

  /** Show `events` in the live answer, up to `[DONE]` or the end of the stream; rejects
   * when the stream breaks. */
  async read(live, events) {
    for await (const event of events) {
      if (event.data === "[DONE]") return;
      if (event.id !== null) live.lastEventId = event.id;
      live.item.reconnecting = false;
      this.onEvent(live, event);
    }
  }

  /** The stream broke off before its end: follow the answer again from the last event
   * seen (GET /v1/requests/{id}/events with Last-Event-ID; any gateway has it), waiting
   * longer after each failed try. Refused (404, 400) or out of time, the answer offers
   * what the store kept. */
  async resume(live) {
    const signal = live.controller.signal;
    let wait = RESUME_FIRST_WAIT_MS;
    let deadline = Date.now() + RESUME_TIMEOUT_MS;
    while (live.requestId && !live.ended && !live.stopped && Date.now() < deadline) {
      live.item.reconnecting = true;
      this.paint(live.item);
      await pause(wait, signal);
      if (live.stopped) break;
      const seen = live.lastEventId;
      try {
        await this.read(live, this.api.resume(live.requestId, seen, signal));
      } catch (error) {
        if (error instanceof ApiError) break;
      }
      if (live.lastEventId === seen) {
        wait = Math.min(wait * 2, RESUME_MAX_WAIT_MS);
      } else {
        wait = RESUME_FIRST_WAIT_MS;
        deadline = Date.now() + RESUME_TIMEOUT_MS;
      }
    }
    live.item.reconnecting = false;
    if (!live.ended && !live.stopped) this.lose(live);
  }

  onEvent(live, { event, data }) {
    const item = live.item;
    const payload = JSON.parse(data);
    switch (event) {
      case "request":
        if (live.requestId) return; // a resumed stream names the request again
        live.requestId = payload.request_id;
        live.messageId = item.message_id = payload.message_id;
        if (live.user) live.user.message_id = payload.user_message_id;
        this.hooks.turnStarted(this.cid);
        return;
      case "queued":
        item.queue = payload;
        break;
      case "model":
        this.note(live, { routed: payload });
        break;
      case "delta":
        item.queue = null;
        if (!item.retracted && !live.stopped) item.content += payload.delta;
        break;
      case "retract":
        this.note(live, { retracted: payload });
        item.content = payload.replacement;
        item.queue = null;
        break;
      case "error":
        live.ended = true;
        item.queue = null;
        item.status = "finished_error";
        this.note(live, { error: payload });
        break;
      case "done":
        live.ended = true;
        item.queue = null;
        item.status = payload.status;
        break;
      default:
        return;
    }
    this.schedulePaint(item);
  }

  /** The stream broke off before its end and could not be followed again. */
  lose(live) {
    live.item.queue = null;
    this.note(live, { lost: true });
  }

  note(live, fields) {
    Object.assign(live.item, fields);
    if (live.messageId) this.notes.set(live.messageId, { ...this.notes.get(live.messageId), ...fields });
  }

  // --- rendering ----------------------------------------------------------------------

  render() {
    const nodes = this.items.map((item) => this.renderItem(item));
    this.column.replaceChildren(...nodes);
    this.empty.hidden = this.items.length > 0;
    this.scrollToEnd();
  }

  schedulePaint(item) {
    if (item.paintQueued) return;
    item.paintQueued = true;
    requestAnimationFrame(() => {
      item.paintQueued = false;
      this.paint(item);
    });
  }

  /** Redraw one message in place (the streaming answer). */
  paint(item) {
    if (!item.node?.isConnected) return;
    const stick = this.nearBottom();
    item.node.replaceWith(this.renderItem(item));
    if (stick) this.scrollToEnd(true);
  }

  renderItem(item) {
    const extra = item.message_id ? this.notes.get(item.message_id) : undefined;
    const node = renderMessage(extra ? { ...extra, ...item } : item, item, this);
    item.node = node;
    return node;
  }

  // --- what a message's buttons do (message.js) -------------------------------------

  get busy() {
    return this.live !== null;
  }

  setEditing(item, editing) {
    item.editing = editing;
    this.paint(item);
  }

  reload() {
    this.load().catch((error) => this.failed(error));
  }

  // --- composer, banner, scrolling ----------------------------------------------------

  setBusy(busy) {
    this.button.replaceChildren(icon(busy ? "stop" : "send", 18));
    this.button.setAttribute("aria-label", busy ? "Stop" : "Send");
    this.button.title = busy ? "Stop" : "Send";
    this.button.classList.toggle("stop", busy);
  }

  fitInput() {
    this.input.style.height = "auto";
    this.input.style.height = `${Math.min(this.input.scrollHeight, 200)}px`;
  }

  /** Show why a request failed; with `again`, a Retry button (after Retry-After, if any). */
  failed(error, again = null) {
    if (error instanceof ApiError && error.status === 401) {
      this.hooks.unauthorized();
      return;
    }
    const overloaded = error instanceof ApiError && error.status === 503;
    let wait = error instanceof ApiError && error.retryAfter ? Math.ceil(error.retryAfter) : 0;
    const text = el("span", {});
    const retry = again && el("button", { type: "button", class: "button secondary", onclick: () => {
      this.hideBanner();
      again();
    } }, "Retry");
    const show = () => {
      const base = overloaded ? "chatpipe is overloaded." : error.message || "Something went wrong.";
      text.textContent = wait > 0 ? `${base} Retry in ${duration(wait * 1000)}.` : base;
      if (retry) retry.disabled = wait > 0;
    };
    show();
    clearInterval(this.bannerTimer);
    if (wait > 0) {
      this.bannerTimer = setInterval(() => {
        wait -= 1;
        show();
        if (wait <= 0) clearInterval(this.bannerTimer);
      }, 1000);
    }
    this.banner.replaceChildren(icon("alert", 18), text, retry ?? "");
    this.banner.hidden = false;
  }

  hideBanner() {
    clearInterval(this.bannerTimer);
    this.banner.hidden = true;
  }

  nearBottom() {
    const s = this.scroller;
    return s.scrollHeight - s.scrollTop - s.clientHeight < 80;
  }

  scrollToEnd(force = false) {
    if (force || this.nearBottom()) this.scroller.scrollTop = this.scroller.scrollHeight;
  }
}

/** Resolves after `ms`, or at once when `signal` aborts. */
function pause(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => {
      clearTimeout(timer);
      resolve();
    }, { once: true });
  });
}
