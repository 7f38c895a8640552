// How one message of the thread looks. `shown` is what to draw (the message with the
// chat view's notes on it); the buttons act on `item` through `chat` (a ChatView).
import { duration, el, icon, iconButton } from "./dom.js";
import { renderMarkdown } from "./markdown.js";

const STATUS_LABELS = {
  finished_aborted: "Stopped",
  finished_length: "Stopped at the length limit",
  finished_error: "The answer failed",
};

export function renderMessage(shown, item, chat) {
  if (shown.role === "assistant") return answer(shown, item, chat);
  return shown.editing ? editor(shown, item, chat) : userMessage(shown, item, chat);
}

function userMessage(shown, item, chat) {
  return el("article", { class: "msg user", "data-id": shown.message_id ?? "", "data-seq": shown.seq },
    el("div", { class: "bubble" }, shown.content),
    el("div", { class: "actions" },
      siblingNav(shown, item, chat),
      !shown.pending && iconButton("edit", "Edit", () => chat.setEditing(item, true))));
}

function editor(shown, item, chat) {
  const area = el("textarea", { class: "edit-input", rows: 3, "aria-label": "Edit message" });
  area.value = shown.content;
  const send = () => {
    const text = area.value.trim();
    if (!text || chat.busy) return;
    item.editing = false;
    chat.edit(item, text);
  };
  area.addEventListener("keydown", (event) => {
    if (event.key === "Escape") chat.setEditing(item, false);
    if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    }
  });
  requestAnimationFrame(() => area.focus());
  return el("article", { class: "msg user editing", "data-id": shown.message_id },
    el("div", { class: "editor" }, area,
      el("div", { class: "editor-buttons" },
        el("button", { type: "button", class: "button secondary",
          onclick: () => chat.setEditing(item, false) }, "Cancel"),
        el("button", { type: "button", class: "button primary", onclick: send }, "Send"))));
}

function answer(shown, item, chat) {
  const body = el("div", { class: "body" });
  if (shown.routed) {
    const r = shown.routed;
    body.append(el("div", { class: "routed" },
      `Answered by ${r.model} (${r.requested_model} is ${r.reason.replaceAll("_", " ")})`));
  }
  const withdrawn = shown.retracted || shown.status === "finished_filtered";
  if (withdrawn) {
    // The stored text is the gateway's replacement (e.g. "[removed: pii]"): the notice says it.
    const reason = shown.retracted?.reason;
    body.append(el("div", { class: "retracted", role: "note", title: shown.content || null },
      icon("shield", 16),
      el("span", {}, `This answer was withdrawn by the safety filter${reason ? ` (${reason})` : ""}.`)));
  } else if (shown.content) {
    const content = el("div", { class: `content markdown${shown.streaming ? " streaming" : ""}` });
    content.innerHTML = renderMarkdown(shown.content);
    body.append(content);
  }
  if (shown.queue) body.append(queueLine(shown.queue));
  else if (shown.streaming && !shown.content && !withdrawn) {
    body.append(el("div", { class: "typing", "aria-label": "Thinking" }, el("span"), el("span"), el("span")));
  }
  const notice = footer(shown, item, chat);
  if (notice) body.append(notice);
  if (!shown.streaming) {
    body.append(el("div", { class: "actions" },
      siblingNav(shown, item, chat),
      shown.content && !withdrawn && copyButton(shown.content),
      shown.message_id && iconButton("regenerate", "Regenerate", () => chat.regenerate(item)),
      shown.message_id && ratingButtons(shown, item, chat)));
  }
  return el("article", { class: "msg assistant", "data-id": shown.message_id ?? "",
    "data-seq": shown.seq, "data-status": shown.status ?? (shown.streaming ? "streaming" : "") },
    el("div", { class: "avatar" }, icon("logo", 18)), body);
}

function queueLine({ position, eta_ms: eta }) {
  const about = eta === null || eta === undefined ? "" : ` · about ${duration(eta)}`;
  return el("div", { class: "queue", role: "status" }, icon("clock", 16),
    el("span", {}, `Waiting in line — position ${position}${about}`));
}

function footer(shown, item, chat) {
  if (shown.reconnecting) {
    return el("div", { class: "notice reconnecting", role: "status" }, icon("regenerate", 16),
      el("span", {}, "Reconnecting…"));
  }
  if (shown.lost) {
    return el("div", { class: "notice lost", role: "alert" }, icon("alert", 16),
      el("span", {}, "Connection lost before the answer finished."),
      el("button", { type: "button", class: "link", onclick: () => chat.reload() }, "Show what was saved"));
  }
  if (shown.error) {
    const { code, message, retry_after: after } = shown.error;
    const text = code === "overloaded"
      ? `Too many requests right now${after ? ` — try again in ${Math.ceil(after)} s` : ""}.`
      : message;
    return el("div", { class: "notice error", role: "alert" }, icon("alert", 16), el("span", {}, text),
      !chat.busy && el("button", { type: "button", class: "link", onclick: () => chat.retry(item) }, "Retry"));
  }
  const label = STATUS_LABELS[shown.status];
  return label ? el("div", { class: "status-label" }, label) : null;
}

function siblingNav(shown, item, chat) {
  const { siblings, index } = shown;
  if (!siblings || siblings.length < 2) return null;
  return el("div", { class: "siblings" },
    el("button", { type: "button", class: "icon-button", "aria-label": "Previous version",
      disabled: index === 0, onclick: () => chat.select(item, -1) }, icon("left", 16)),
    el("span", { class: "count" }, `${index + 1} / ${siblings.length}`),
    el("button", { type: "button", class: "icon-button", "aria-label": "Next version",
      disabled: index === siblings.length - 1, onclick: () => chat.select(item, 1) }, icon("right", 16)));
}

// Thumbs up / down: the rating sent last is pressed (the page remembers it, the store does not).
function ratingButtons(shown, item, chat) {
  return [["up", "Good answer"], ["down", "Bad answer"]].map(([rating, label]) => {
    const button = iconButton(rating, label, () => chat.rate(item, rating));
    button.classList.add("rate");
    button.dataset.rating = rating;
    button.setAttribute("aria-pressed", String(shown.rating === rating));
    return button;
  });
}

function copyButton(text) {
  const button = iconButton("copy", "Copy", async () => {
    await navigator.clipboard?.writeText(text).catch(() => {});
    button.replaceChildren(icon("check"));
    setTimeout(() => button.replaceChildren(icon("copy")), 1200);
  });
  return button;
}
