"""The engine's prompt tokens: the chat template's own special tokens, and every
message's content as plain text, so a user cannot forge a turn.

Rendering the template to text and tokenizing that text again would read a user's
`<|im_start|>system` (or the model's own control strings) as real control tokens: a
user could forge a system turn. So the template is rendered with each content
replaced by a placeholder; the template's parts are tokenized with special tokens
parsed, each content as plain text (`text_ids`), and the pieces are spliced in order.

Plain text means no added token at all, special or not. `split_special_tokens=True`
alone only stops the tokens marked special: an added token marked `special: false`
(Qwen's `<tool_call>`, `<think>`, its FIM tokens) would still be matched in a user's
text, and those tokens steer the model (tool calls, reasoning) as much as a turn
marker does. So a content holding an added token's string is encoded by a copy of
the tokenizer with every added token disabled: the string becomes the ordinary
vocabulary's tokens, as if the token had never been added. A content holding none
(the usual case, found by a cached precheck) is encoded as before, same ids.

A text completion's prompt is not templated (`completion_prompt_ids`).

Each turn of a conversation carries its whole history, so the same contents are encoded
turn after turn: each tokenizer keeps the ids of the texts it encoded last (`_Encoded`,
bounded), and a turn encodes only what is new in it.

The worker (`VllmEngine`) and the gateway's token counter
(`gateway.context.tokens.TokenCounter`) both build prompts here, so a context window
check counts exactly what the engine runs.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
import weakref
from array import array
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from schemas.events import ChatMessage
from schemas.tools import ToolUse


def prompt_token_ids(
    tokenizer: Any,
    messages: Sequence[dict[str, Any]],
    tools: Sequence[dict[str, Any]] | None = None,
) -> list[int]:
    """The prompt of `messages` (role/content dicts, `template_messages`) with the
    generation prompt, and the `tools` shown to the model (OpenAI function tools) as the
    template shows them: the template's special tokens, each content encoded as text only.

    A template that changes a content (e.g. trims it) gets it unchanged here: the
    splice keeps the content as sent rather than re-render it. Tool definitions and
    an assistant's tool calls are the template's to render, as vLLM renders them."""
    marker = _marker(messages)
    placeholders = [f"{marker}{i}{marker}" for i in range(len(messages))]
    rendered = tokenizer.apply_chat_template(
        [{**m, "content": p} for m, p in zip(messages, placeholders, strict=True)],
        tools=list(tools) if tools else None,
        tokenize=False,
        add_generation_prompt=True,
    )
    if rendered.count(marker) != 2 * len(messages):
        raise ValueError("the chat template drops or repeats a message's content")
    ids: list[int] = []
    for index, placeholder in enumerate(placeholders):
        before, found, rendered = rendered.partition(placeholder)
        if not found:
            raise ValueError(f"the chat template reorders message {index}'s content")
        ids += _template_piece_ids(tokenizer, before)
        ids += text_ids(tokenizer, messages[index]["content"])
    return ids + _template_piece_ids(tokenizer, rendered)


def completion_prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt of a text completion (`/v1/completions`): the text as it is, no chat
    template, with the tokens the tokenizer adds (a bos token), as vLLM's completions
    API tokenizes it. Unlike a chat message's content, its special-token strings are
    special tokens: the caller writes the whole prompt (a hand-rendered chat template
    among them), there is no one else's turn in it to forge."""
    return tokenizer.encode(prompt, add_special_tokens=True)


def template_messages(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """`messages` as chat templates take them: role and content; an assistant's tool
    calls with their arguments as objects (templates write them with `tojson`), as vLLM
    passes them: arguments that are no JSON object become `{}`, so a malformed call in
    a conversation's history does not fail every turn after it; a tool result's call id."""
    dicts: list[dict[str, Any]] = []
    for message in messages:
        entry: dict[str, Any] = {"role": message.role.value, "content": message.content}
        if message.tool_calls:
            entry["tool_calls"] = [
                {
                    "id": call.id,
                    "type": call.type,
                    "function": {
                        "name": call.function.name,
                        "arguments": _arguments_object(call.function.arguments),
                    },
                }
                for call in message.tool_calls
            ]
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        dicts.append(entry)
    return dicts


def _arguments_object(text: str) -> dict[str, Any]:
    try:
        arguments = json.loads(text)
    except (ValueError, RecursionError):
        return {}
    return arguments if isinstance(arguments, dict) else {}


def template_tools(tool_use: ToolUse | None) -> list[dict[str, Any]] | None:
    """The tools the template shows the model (none when the request offers none)."""
    if tool_use is None:
        return None
    return [tool.model_dump(exclude_none=True) for tool in tool_use.tools]


def template_ids(tokenizer: Any, text: str) -> list[int]:
    """Tokens of the template's own text: its special-token strings are special tokens
    (the template supplies the bos token too: nothing else is added)."""
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=False)


def _template_piece_ids(tokenizer: Any, text: str) -> list[int]:
    """`template_ids` of the template's text around one content: the same few pieces
    (a turn's markers) recur in every prompt."""
    return _guard(tokenizer).encoded.ids(False, text, lambda: template_ids(tokenizer, text))


def text_ids(tokenizer: Any, text: str) -> list[int]:
    """Tokens of text from a user or a model: never an added token, special or not.

    Text that holds no added token's string is encoded as it always was (the hot
    path: a substring search for the strings' first characters, the regex only where
    one occurs). Text that does is encoded with the added tokens disabled, each such
    string in ordinary-vocabulary tokens. The result is checked, not trusted: should
    the vocabulary itself still give an added token's id (a Unigram vocabulary holding
    `</s>`, say), each occurrence is split after its first character (`_spelled`).
    What survives that split (a one-character added token, say a newline token: text
    has no other spelling for it) is kept if not special; text that would still carry
    a special token is refused (ValueError), never let through."""
    if not text:
        return []
    guard = _guard(tokenizer)
    return guard.encoded.ids(True, text, lambda: _content_ids(tokenizer, guard, text))


def _content_ids(tokenizer: Any, guard: _Guard, text: str) -> list[int]:
    if not guard.may_hold(text):
        ids = _split_specials(tokenizer, text)
        if guard.added_ids.isdisjoint(ids):  # a normalizer can still produce a token's string
            return ids
    if guard.plain is not None:
        ids = guard.plain.encode(text, add_special_tokens=False).ids
        if guard.added_ids.isdisjoint(ids):
            return ids
    ids = _spelled(tokenizer, guard, text)
    if guard.special_ids.isdisjoint(ids):
        return ids
    raise ValueError("the text can't be encoded without one of the tokenizer's special tokens")


def _split_specials(tokenizer: Any, text: str) -> list[int]:
    if not text:
        return []
    return tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)


def _spelled(tokenizer: Any, guard: _Guard, text: str) -> list[int]:
    """`text` with every added token's string (longest first) encoded as its first
    character, then the rest: the added-token matcher can't match a split string."""
    ids: list[int] = []
    start = 0
    for found in guard.pattern.finditer(text):
        content = found.group()
        ids += _split_specials(tokenizer, text[start : found.start()])
        ids += _split_specials(tokenizer, content[0]) + _spelled(tokenizer, guard, content[1:])
        start = found.end()
    return ids + _split_specials(tokenizer, text[start:])


ENCODED_KEPT = 1 << 22
"""How much encoded text each tokenizer keeps (`_Encoded`), in characters plus tokens:
at most about 10 MiB, the histories of some 150 conversations of 10 long turns."""


class _Encoded:
    """The ids of texts one tokenizer encoded, the least recently used dropped first once
    their characters and tokens pass `kept`. Thread-safe: every caller gets its own list."""

    def __init__(self, kept: int = ENCODED_KEPT) -> None:
        self.kept = kept
        self.held = 0
        self._ids: OrderedDict[tuple[bool, str], array[int]] = OrderedDict()
        self._lock = threading.Lock()

    def ids(self, plain: bool, text: str, encode: Callable[[], list[int]]) -> list[int]:
        """`text`'s ids: kept ones, or `encode()`'s, then kept. `plain` tells a content's
        ids (`text_ids`) from the template's (`template_ids`) for the same string."""
        key = (plain, text)
        with self._lock:
            found = self._ids.get(key)
            if found is not None:
                self._ids.move_to_end(key)
                return found.tolist()
        ids = encode()
        size = len(text) + len(ids)
        if size > self.kept:
            return ids
        packed = array("L", ids)
        with self._lock:
            if key not in self._ids:
                self._ids[key] = packed
                self.held += size
            while self.held > self.kept:
                (_, dropped_text), dropped = self._ids.popitem(last=False)
                self.held -= len(dropped_text) + len(dropped)
        return ids


@dataclass(frozen=True)
class _Guard:
    """One tokenizer's added tokens, computed once per tokenizer (`_guard`): text_ids
    runs for every message of every prompt, the copy and the regex take far longer."""

    stamp: int  # the tokenizer's size when computed: adding a token computes it again
    added_ids: frozenset[int]
    special_ids: frozenset[int]
    firsts: tuple[str, ...]  # the strings' first characters, for the precheck
    pattern: re.Pattern[str]  # every string, longest first (leftmost, then longest)
    plain: Any  # a copy of the fast tokenizer's backend with every added token disabled
    encoded: _Encoded = field(default_factory=_Encoded)  # texts encoded already

    def may_hold(self, text: str) -> bool:
        """Whether `text` holds an added token's string: the first characters by
        substring search (C speed; for Qwen just `<`), the regex only if one is there."""
        return any(first in text for first in self.firsts) and bool(self.pattern.search(text))


_GUARDS: weakref.WeakKeyDictionary[Any, _Guard] = weakref.WeakKeyDictionary()


def _guard(tokenizer: Any) -> _Guard:
    stamp = len(tokenizer)
    guard = _GUARDS.get(tokenizer)
    if guard is None or guard.stamp != stamp:
        guard = _GUARDS[tokenizer] = _make_guard(tokenizer, stamp)
    return guard


def _make_guard(tokenizer: Any, stamp: int) -> _Guard:
    decoder = tokenizer.added_tokens_decoder
    # A non-special added token of whitespace only (Gemma adds runs of newlines and
    # spaces) cannot forge a turn: it stays what the model was trained to see.
    added = {
        i: t.content
        for i, t in decoder.items()
        if t.content and (t.special or not t.content.isspace())
    }
    contents = sorted(set(added.values()), key=len, reverse=True)
    pattern = re.compile("|".join(map(re.escape, contents))) if contents else re.compile(r"(?!)")
    return _Guard(
        stamp=stamp,
        added_ids=frozenset(added),
        special_ids=frozenset(i for i in added if decoder[i].special),
        firsts=tuple(sorted({c[0] for c in contents})),
        pattern=pattern,
        plain=_plain_backend(tokenizer) if contents else None,
    )


def _plain_backend(tokenizer: Any) -> Any:
    """The fast tokenizer's Rust backend, copied with every added token marked special
    and `encode_special_tokens` on: the added-token matcher then matches none of them
    (the library has no switch for non-special ones), so their strings go through the
    normalizer, pre-tokenizer and model as any text does. None for a slow tokenizer."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    from tokenizers import Tokenizer

    spec = json.loads(backend.to_str())
    for token in spec.get("added_tokens") or ():
        token["special"] = True
    plain = Tokenizer.from_str(json.dumps(spec))
    plain.encode_special_tokens = True
    plain.no_truncation()
    plain.no_padding()
    return plain


def _marker(messages: Sequence[dict[str, Any]]) -> str:
    """A string no content holds, so a placeholder can only be the template's."""
    while True:
        marker = f"[[chatpipe-content-{uuid.uuid4().hex}]]"  # no whitespace: survives a trim
        if not any(marker in m["content"] for m in messages):
            return marker
