// The conversation list: newest first, a page at a time, with rename and delete.
import { routes } from "./api.js";
import { el, icon, iconButton } from "./dom.js";

export class Sidebar {
  /** hooks: renamed(conversation), deleted(cid), failed(error) */
  constructor(root, api, hooks) {
    this.api = api;
    this.hooks = hooks;
    this.list = root.querySelector("#conversations");
    this.more = root.querySelector("#more");
    this.conversations = [];
    this.cursor = null;
    this.current = null;
    this.renaming = null;
    this.confirming = null;
    this.more.addEventListener("click", () => this.loadMore());
  }

  /** Reload the first page (keeps as many rows as were shown, up to a page). */
  async refresh() {
    try {
      const page = await this.api.json("GET", routes.conversations(null));
      this.conversations = page.data;
      this.cursor = page.next_cursor;
      this.render();
    } catch (error) {
      this.hooks.failed(error);
    }
  }

  async loadMore() {
    if (!this.cursor) return;
    try {
      const page = await this.api.json("GET", routes.conversations(this.cursor));
      const known = new Set(this.conversations.map((c) => c.conversation_id));
      this.conversations.push(...page.data.filter((c) => !known.has(c.conversation_id)));
      this.cursor = page.next_cursor;
      this.render();
    } catch (error) {
      this.hooks.failed(error);
    }
  }

  select(cid) {
    this.current = cid;
    this.render();
  }

  /** A conversation just created here: shown at once, before the list is read again. */
  add(conversation) {
    this.conversations = [conversation,
      ...this.conversations.filter((c) => c.conversation_id !== conversation.conversation_id)];
    this.current = conversation.conversation_id;
    this.render();
  }

  title(cid) {
    return this.conversations.find((c) => c.conversation_id === cid)?.title;
  }

  render() {
    this.list.replaceChildren(...this.conversations.map((c) => this.row(c)));
    if (this.conversations.length === 0) {
      this.list.append(el("li", { class: "muted empty-list" }, "No conversations yet"));
    }
    this.more.hidden = !this.cursor;
  }

  row(conversation) {
    const cid = conversation.conversation_id;
    const current = cid === this.current;
    if (this.renaming === cid) return this.renameRow(conversation);
    if (this.confirming === cid) {
      return el("li", { class: "conversation confirming", "data-id": cid },
        el("span", { class: "label" }, "Delete this chat?"),
        el("button", { type: "button", class: "button danger small", onclick: () => this.remove(cid) },
          "Delete"),
        el("button", { type: "button", class: "button secondary small", onclick: () => {
          this.confirming = null;
          this.render();
        } }, "Cancel"));
    }
    return el("li", { class: `conversation${current ? " current" : ""}`, "data-id": cid },
      el("a", { href: `#/c/${cid}`, class: "label", "aria-current": current ? "page" : null,
        title: conversation.title || "New chat" }, conversation.title || "New chat"),
      el("span", { class: "row-actions" },
        iconButton("edit", "Rename", () => {
          this.renaming = cid;
          this.render();
        }),
        iconButton("trash", "Delete", () => {
          this.confirming = cid;
          this.render();
        })));
  }

  renameRow(conversation) {
    const cid = conversation.conversation_id;
    const input = el("input", { class: "rename-input", "aria-label": "Chat title", maxlength: 200 });
    input.value = conversation.title;
    let done = false;
    const finish = async (save) => {
      if (done) return;
      done = true;
      this.renaming = null;
      const title = input.value.trim();
      if (save && title !== conversation.title) {
        try {
          const renamed = await this.api.json("PATCH", routes.conversation(cid), { title });
          Object.assign(conversation, renamed);
          this.hooks.renamed(renamed);
        } catch (error) {
          this.hooks.failed(error);
        }
      }
      this.render();
    };
    input.addEventListener("keydown", (event) => {
      if (event.key === "Enter") finish(true);
      if (event.key === "Escape") finish(false);
    });
    input.addEventListener("blur", () => finish(true));
    requestAnimationFrame(() => {
      input.focus();
      input.select();
    });
    return el("li", { class: "conversation renaming", "data-id": cid }, icon("edit", 16), input);
  }

  async remove(cid) {
    this.confirming = null;
    try {
      await this.api.json("DELETE", routes.conversation(cid));
      this.conversations = this.conversations.filter((c) => c.conversation_id !== cid);
      this.render();
      this.hooks.deleted(cid);
    } catch (error) {
      this.hooks.failed(error);
    }
  }
}
