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

/** Safe HTML for `text`. */
export function renderMarkdown(text) {
  return purify.sanitize(marked.parse(text), { USE_PROFILE: { html: true } });
}
