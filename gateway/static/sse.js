// Server-sent events read from a fetch() body: EventSource cannot POST, and the
// native API answers a POST. Follows the SSE spec's parsing rules
// (https://html.spec.whatwg.org/multipage/server-sent-events.html#parsing-an-event-stream).

/** Yields {event, data, id} for each event of `body` (a ReadableStream of bytes). */
export async function* readEvents(body) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  let buffer = "";
  let event = null;
  let data = [];
  let id = null;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += value;
      const lines = buffer.split("\n");
      buffer = lines.pop();
      for (const raw of lines) {
        const line = raw.endsWith("\r") ? raw.slice(0, -1) : raw;
        if (line === "") {
          if (data.length > 0) yield { event: event ?? "message", data: data.join("\n"), id };
          event = null;
          data = [];
          id = null;
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const name = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (name === "event") event = value;
        else if (name === "data") data.push(value);
        else if (name === "id") id = value;
      }
    }
  } finally {
    reader.releaseLock();
  }
}
