// Answers are Markdown from a model: rendered with marked, then sanitised with
// DOMPurify before they touch the DOM (the page's CSP is the second line).
import { marked } from "./marked-18.2.1.esm.min.js";

const purify = window.DOMPurify;

marked.use({ gfm: true, breaks: true });

purify.addHook("afterSanitizeAttributes", (node) => {
  if (node.tagName === "A") {
    node.setAttribute("target", "_blank");
    node.setAttribute("rel", "noopener noreferrer nofollow");
  }
});

// An answer is text to read: nothing in it takes input, submits, embeds another page or
// restyles this one (DOMPurify drops `on*` handlers by itself).
const ANSWER_PROFILE = {
  USE_PROFILES: { html: true },
  FORBID_TAGS: ["form", "input", "button", "textarea", "select", "option", "optgroup",
                "datalist", "fieldset", "label", "output", "iframe", "frame", "object",
                "embed", "style", "link", "meta", "base", "dialog"],
  FORBID_ATTR: ["action", "formaction", "form", "style", "srcdoc"],
};

/** Safe HTML for `text`. */
export function renderMarkdown(text) {
  return purify.sanitize(marked.parse(text), ANSWER_PROFILE);
}
