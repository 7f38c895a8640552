// The native API (docs/api/native.md), as the page uses it.
import { readEvents } from "./sse.js";

const enc = encodeURIComponent;

export const routes = {
  models: () => "/v1/models",
  conversations: (cursor) =>
    `/v1/conversations?limit=20${cursor ? `&cursor=${enc(cursor)}` : ""}`,
  newConversation: () => "/v1/conversations",
  conversation: (cid) => `/v1/conversations/${enc(cid)}`,
  messages: (cid) => `/v1/conversations/${enc(cid)}/messages`,
  edit: (cid, mid) => `/v1/conversations/${enc(cid)}/messages/${enc(mid)}/edit`,
  regenerate: (cid, mid) => `/v1/conversations/${enc(cid)}/messages/${enc(mid)}/regenerate`,
  select: (cid, mid) => `/v1/conversations/${enc(cid)}/messages/${enc(mid)}/select`,
  cancel: (rid) => `/v1/requests/${enc(rid)}/cancel`,
  events: (rid) => `/v1/requests/${enc(rid)}/events`,
  feedback: (mid) => `/v1/messages/${enc(mid)}/feedback`,
};

/** An HTTP error answer: `{error: {code, message}}`, with Retry-After when there is one. */
export class ApiError extends Error {
  constructor(status, code, message, retryAfter) {
    super(message);
    this.status = status;
    this.code = code;
    this.retryAfter = retryAfter;
  }
}

async function failure(response) {
  let code = `http_${response.status}`;
  let message = response.statusText || "request failed";
  try {
    const body = await response.json();
    code = body.error?.code ?? code;
    message = body.error?.message ?? message;
  } catch {
    // not JSON: keep the status line
  }
  const header = response.headers.get("Retry-After");
  const retryAfter = header === null ? null : Number(header);
  return new ApiError(response.status, code, message, Number.isFinite(retryAfter) ? retryAfter : null);
}

export class Api {
  constructor(key) {
    this.key = key;
  }

  async send(method, path, body, signal, extraHeaders = {}) {
    const headers = { ...extraHeaders, Authorization: `Bearer ${this.key}` };
    if (body !== undefined) headers["Content-Type"] = "application/json";
    const response = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
      cache: "no-store",
    });
    if (!response.ok) throw await failure(response);
    return response;
  }

  async json(method, path, body) {
    const response = await this.send(method, path, body);
    return response.status === 204 ? null : response.json();
  }

  /** POSTs `body` and yields the answer's SSE events; throws ApiError before the stream starts. */
  stream(path, body, signal) {
    return this.events("POST", path, body, signal);
  }

  /** The events of answer `requestId` after event `lastEventId` (all of them with null),
   * live until its end, from any gateway; throws ApiError (404, 400) before the stream. */
  resume(requestId, lastEventId, signal) {
    const headers = lastEventId === null ? {} : { "Last-Event-ID": lastEventId };
    return this.events("GET", routes.events(requestId), undefined, signal, headers);
  }

  async *events(method, path, body, signal, headers) {
    const response = await this.send(method, path, body, signal, headers);
    yield* readEvents(response.body);
  }
}
