// The selected thread of a conversation tree (GET /v1/conversations/{id}), with
// each message's siblings (its regenerations or edits) for "2 / 3" navigation.

/** [{message_id, role, content, status, model, siblings: [ids], index}], root first. */
export function threadItems(detail) {
  const byId = new Map(detail.messages.map((m) => [m.message_id, m]));
  return detail.thread
    .map((id) => byId.get(id))
    .filter((m) => m && (m.role === "user" || m.role === "assistant"))
    .map((m) => {
      const siblings = m.parent_id === null ? detail.roots : byId.get(m.parent_id)?.children ?? [m.message_id];
      return { ...m, siblings, index: siblings.indexOf(m.message_id) };
    });
}
