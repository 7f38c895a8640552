// The page: sign in with an API key, then the conversation list and the chat view.
// The key stays in this browser's localStorage; every request sends it as a Bearer token.
import { Api, ApiError, routes } from "./api.js";
import { ChatView } from "./chat.js";
import { Sidebar } from "./sidebar.js";

const KEY_ITEM = "chatpipe.apiKey";
const MODEL_ITEM = "chatpipe.model";
const TITLE_DELAY_MS = 2500; // titles are generated after the first answer

const $ = (selector) => document.querySelector(selector);
const api = new Api(localStorage.getItem(KEY_ITEM) ?? "");
const modelPicker = $("#model");

const chat = new ChatView($("#chat"), api, {
  model: () => modelPicker.value || undefined,
  created(conversation) {
    sidebar.add(conversation);
    history.replaceState(null, "", `#/c/${conversation.conversation_id}`);
  },
  turnStarted: (cid) => sidebar.refresh().then(() => showTitle(cid)),
  turnEnded(cid) {
    sidebar.refresh().then(() => showTitle(cid));
    setTimeout(() => sidebar.refresh().then(() => showTitle(cid)), TITLE_DELAY_MS);
  },
  unauthorized: signOut,
});

const sidebar = new Sidebar($("#sidebar"), api, {
  renamed: (conversation) => showTitle(conversation.conversation_id),
  deleted(cid) {
    if (chat.cid === cid) location.hash = "";
  },
  failed: (error) => chat.failed(error),
});

function showTitle(cid) {
  const title = sidebar.title(cid);
  if (cid === chat.cid && title) $("#chat-title").textContent = title;
}

function currentConversation() {
  const match = location.hash.match(/^#\/c\/([\w-]+)$/);
  return match ? match[1] : null;
}

async function route() {
  const cid = currentConversation();
  document.body.classList.remove("sidebar-open");
  if (cid === chat.cid && cid !== null) return;
  sidebar.select(cid);
  await chat.open(cid);
}

async function loadModels() {
  const { data } = await api.json("GET", routes.models());
  const chatModels = data.filter((m) => m.kind === "chat");
  const saved = localStorage.getItem(MODEL_ITEM);
  modelPicker.replaceChildren(...chatModels.map((m) => new Option(m.id, m.id)));
  if (chatModels.some((m) => m.id === saved)) modelPicker.value = saved;
  modelPicker.disabled = chatModels.length < 2;
}

async function start() {
  $("#signin").hidden = true;
  $("#app").hidden = false;
  await Promise.all([loadModels(), sidebar.refresh()]);
  await route();
}

function signOut() {
  localStorage.removeItem(KEY_ITEM);
  api.key = "";
  $("#app").hidden = true;
  $("#signin").hidden = false;
  $("#api-key").focus();
}

$("#signin-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  const key = $("#api-key").value.trim();
  const error = $("#signin-error");
  error.hidden = true;
  api.key = key;
  try {
    await api.json("GET", routes.models());
  } catch (failure) {
    error.textContent = failure instanceof ApiError && failure.status === 401
      ? "That API key was not accepted."
      : `Could not reach chatpipe: ${failure.message}`;
    error.hidden = false;
    return;
  }
  localStorage.setItem(KEY_ITEM, key);
  $("#api-key").value = "";
  await start();
});

$("#new-chat").addEventListener("click", () => {
  if (location.hash) location.hash = "";
  else route();
});
$("#sign-out").addEventListener("click", signOut);
$("#menu").addEventListener("click", () => document.body.classList.toggle("sidebar-open"));
$("#scrim").addEventListener("click", () => document.body.classList.remove("sidebar-open"));
modelPicker.addEventListener("change", () => localStorage.setItem(MODEL_ITEM, modelPicker.value));
window.addEventListener("hashchange", route);

if (api.key) start().catch((error) => (error instanceof ApiError && error.status === 401 ? signOut() : chat.failed(error)));
else signOut();
