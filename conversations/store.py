"""The conversation store interface and its records.

Implementations: `conversations.sqlite_store.SQLiteStore` (one machine) and
`conversations.cassandra_store.CassandraStore` (scale). Both pass
`tests/integration/test_store_conformance.py`.

Contracts every store keeps:

* Every write is idempotent on its id, so redelivered events never store a
  message twice.
* Ownership is by (org_id, user_id): two orgs may each have a user with the
  same id, and neither sees the other's conversations. Reads keyed by a
  conversation or message id (`get_conversation`, `list_messages`, `get_tree`,
  `message_usage`, `list_summaries`, …) do not check who asks — the caller
  compares the record's (org_id, user_id) with its own first, as the gateway's
  `owned_conversation` dependency does. Writes that change an existing
  conversation on a user's behalf (`rename_conversation`,
  `delete_conversation`, `select_message`) take the `user_id` and `org_id`
  and do nothing (None / False, as for an unknown id) unless that user of that
  org owns it. Pipeline writes (`add_message`, `start_answer`, `finish_answer`,
  `set_auto_title`, `save_summary`, `save_embeddings`) are trusted and unchecked.
* Branches: a message's `parent_id` links it to the message it follows;
  regenerations (assistant) and edits (user) are siblings under one parent.
  The store remembers, per parent, which child is selected: `add_message`
  selects the new message, `select_message` selects an older one.
* Streaming answers: the gateway stores an answer as it queues its request
  (`start_answer`: status IN_PROGRESS, empty content, with its `RequestRecord`);
  whoever sees the answer end first gives it its final text (`finish_answer`),
  and only that one writer succeeds.
* Orgs and the response cache: an org's settings (`set_org_settings`; an org never set
  has `OrgSettings`' defaults) say whether its answers may be cached, and how many
  generations each of its keys may run at once. A cached answer
  (`put_cached_response`) is found by its key and its org only (`get_cached_response`)
  until it expires (the store clock; Cassandra also drops it with a TTL).
* API keys: only a keyed hash of a key is stored (`hash_api_key`: HMAC-SHA256
  under the deployment's key secret, which the store is opened with), with a
  public `key_id`, the owner and its tier, a name, an expiry, a revocation
  time and the key's own limit on concurrent generations. `find_api_key` returns
  the row as stored, revoked or expired alike: whoever authenticates decides with
  `ApiKey.refusal(now)`. Nothing caches a
  key, so a revocation holds on every gateway from its next request.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import orjson

from conversations.files import FileStore
from schemas.api import TurnUsage
from schemas.events import Role
from schemas.lifecycle import RequestStatus
from schemas.tools import ToolStep
from schemas.topics import Tier

if TYPE_CHECKING:
    from collections.abc import Mapping

    from conversations.tree import ConversationTree


@dataclass(frozen=True, slots=True)
class Conversation:
    """`title` is the user's (set on create or by rename); `auto_title` the generated one.
    Its owner is (`org_id`, `user_id`)."""

    conversation_id: str
    user_id: str
    title: str
    created_at: float
    auto_title: str = ""
    org_id: str = ""

    @property
    def display_title(self) -> str:
        """What a conversation list shows: the user's title, else the generated one."""
        return self.title or self.auto_title

    def owned_by(self, owner: ApiKey) -> bool:
        return owns(self.org_id, self.user_id, owner)


@dataclass(frozen=True, slots=True)
class ConversationPage:
    """One page of a user's conversations, newest first.

    `next_cursor` is None on the last page; otherwise pass it back as
    `cursor` for the next page. Cursors are opaque strings (a position, not
    an offset: conversations created meanwhile never shift a page).
    """

    conversations: list[Conversation]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class NewMessage:
    message_id: str
    conversation_id: str
    role: Role
    content: str
    parent_id: str | None = None
    model: str | None = None
    tokens: int = 0
    status: RequestStatus = RequestStatus.FINISHED_STOPPED
    request_id: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    alias: str | None = None
    tool_steps: tuple[ToolStep, ...] = ()
    """An answer's server-tool calls and results (kept by `save_tool_steps`)."""


@dataclass(frozen=True, slots=True)
class StoredMessage:
    """A stored message. For an answer, `tokens` counts its completion tokens and
    `prompt_tokens` / `cached_tokens` its prompt and the part of it the engine's
    prefix cache served (0 when unknown, and for user messages). `alias`: the model
    alias the answer was asked for, whose version `model` is (None: a model named
    directly); set when the answer is first stored, never changed."""

    message_id: str
    conversation_id: str
    seq: int
    role: Role
    content: str
    parent_id: str | None
    model: str | None
    tokens: int
    status: RequestStatus
    request_id: str | None
    created_at: float
    prompt_tokens: int = 0
    cached_tokens: int = 0
    alias: str | None = None


def branch_ends(messages: Sequence[StoredMessage], message_ids: Collection[str]
                ) -> list[StoredMessage]:  # fmt: skip
    """The messages of `message_ids` among `messages` (a conversation's), to delete;
    ValueError if a message kept has its parent among them (`delete_messages`)."""
    wanted = {m.message_id for m in messages} & set(message_ids)
    orphaned = [m.message_id for m in messages
                if m.parent_id in wanted and m.message_id not in wanted]  # fmt: skip
    if orphaned:
        raise ValueError(f"deleting these would leave {orphaned} without a parent")
    return [m for m in messages if m.message_id in wanted]


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """The request behind a stored answer: who may resume or cancel it ((`org_id`,
    `user_id`)), and where its events start on `chat.answers` (partition, offset of its
    AnswerStarted marker)."""

    request_id: str
    conversation_id: str
    message_id: str
    user_id: str
    answers_partition: int
    answers_offset: int
    reply_to: str  # the delivery topic of the gateway that queued it
    created_at: float = 0.0  # set by the store on write (store clock), like a message's
    org_id: str = ""  # "" (a record from before orgs were kept) is nobody's

    def owned_by(self, owner: ApiKey) -> bool:
        return owns(self.org_id, self.user_id, owner)


@dataclass(frozen=True, slots=True)
class Summary:
    """A rolling summary of a thread from its root up to `through_message_id` included."""

    conversation_id: str
    through_message_id: str
    content: str
    created_at: float


@dataclass(frozen=True, slots=True)
class ApiKey:
    """An API key's row: who it belongs to (user, org, tier) and whether it still opens.

    Only a keyed hash of the key itself is stored. `key_id` is public (`chatpipe keys
    list`, `chatpipe keys revoke KEY_ID`); a store given none derives it from the hash.
    Times are epoch seconds; `expires_at` None never expires, `revoked_at` None is not
    revoked."""

    user_id: str
    org_id: str
    tier: Tier
    created_at: float = field(default=0.0)
    key_id: str = ""
    name: str = ""
    expires_at: float | None = None
    revoked_at: float | None = None
    max_concurrent_requests: int | None = None
    """Generations the key may run at once; None: its org's limit, else its tier's
    (`gateway.admission.concurrency`)."""

    def refusal(self, now: float) -> str | None:
        """Why the key no longer opens at `now`, or None while it does."""
        if self.revoked_at is not None:
            return "this API key has been revoked"
        if self.expires_at is not None and now >= self.expires_at:
            return "this API key has expired"
        return None


@dataclass(frozen=True, slots=True)
class OrgSettings:
    """An org's settings (`chatpipe orgs set`); an org never set has these defaults."""

    org_id: str
    response_cache: bool = False
    """Its exact-match answers may be cached and replayed (`gateway.cache.rules`)."""
    max_concurrent_requests: int | None = None
    """Generations each of its keys may run at once, unless the key sets its own; None:
    the key's tier's (`gateway.admission.concurrency`)."""


@dataclass(frozen=True, slots=True)
class CachedResponse:
    """A finished answer the response cache keeps under `cache_key` (a digest of org,
    model, prompt and sampling: `gateway.cache.rules.cache_key`) until `expires_at`
    (epoch seconds)."""

    cache_key: str
    org_id: str
    model: str
    content: str
    prompt_tokens: int
    completion_tokens: int
    status: RequestStatus
    created_at: float
    expires_at: float


class ConversationStore(FileStore, Protocol):
    """A user's documents too (`conversations.files`)."""

    async def open(self) -> None:
        """Connect, and create the schema if needed."""

    async def close(self) -> None: ...

    # --- conversations ------------------------------------------------------------

    async def create_conversation(
        self, conversation_id: str, user_id: str, title: str = "", *, org_id: str
    ) -> Conversation:
        """Create it for (`org_id`, `user_id`), or return the one already stored under this
        id unchanged."""

    async def get_conversation(self, conversation_id: str) -> Conversation | None: ...

    async def list_conversations(
        self, user_id: str, *, org_id: str, limit: int = 50, cursor: str | None = None
    ) -> ConversationPage:
        """A page of the conversations of (`org_id`, `user_id`), newest `created_at` first."""

    async def rename_conversation(
        self, conversation_id: str, user_id: str, title: str, *, org_id: str
    ) -> Conversation | None:
        """Set the user's title; None if there is no such conversation of (`org_id`,
        `user_id`)."""

    async def set_auto_title(self, conversation_id: str, title: str) -> None:
        """Store the generated title (shown while the user has set none)."""

    async def delete_conversation(self, conversation_id: str, user_id: str, *, org_id: str) -> bool:
        """Delete it with its messages, branch choices, summaries, embeddings, citations
        and request records.

        False if there is no such conversation of (`org_id`, `user_id`)."""

    # --- messages -----------------------------------------------------------------

    async def add_message(self, message: NewMessage) -> StoredMessage:
        """Append with the next seq and select it under its parent.

        A message_id already stored is returned as is, changing nothing."""

    async def get_message(self, message_id: str) -> StoredMessage | None: ...

    async def start_answer(self, message: NewMessage, request: RequestRecord) -> StoredMessage:
        """Store an answer about to be generated, with its request, in one write: the
        message (given with status IN_PROGRESS and empty content) is appended and
        selected under its parent exactly as `add_message` does. Idempotent: a
        message_id already stored is returned unchanged (and the request record is not
        overwritten). ValueError unless `message` is the IN_PROGRESS answer of `request`
        (same message, conversation and request ids)."""

    async def finish_answer(self, message: NewMessage) -> bool:
        """Give an IN_PROGRESS answer its final content, tokens, prompt/cached tokens,
        model and status (from `message`, matched by message_id).

        True if it changed the row; False, changing nothing, when no such message is
        stored or it is no longer IN_PROGRESS (another writer finished it first, or
        its conversation was deleted). Never inserts. Of two concurrent calls, only
        one returns True."""

    async def delete_messages(self, conversation_id: str, message_ids: Collection[str]) -> int:
        """Delete these messages of the conversation with what is kept of each (its
        request record, summaries through it, embeddings, citations, tool steps, the
        branch choices naming it); a parent whose selected child is deleted shows its
        newest child. How many messages were deleted (ids not in the conversation are
        skipped). ValueError, deleting nothing, if a message kept would lose its parent:
        only a branch's end is deleted."""

    async def get_request(self, request_id: str) -> RequestRecord | None: ...

    async def in_progress_requests(self, conversation_id: str) -> list[str]:
        """Request ids of the conversation's answers still IN_PROGRESS (to cancel them)."""

    async def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        """All messages of a conversation (every branch) in seq order."""

    async def get_tree(self, conversation_id: str) -> ConversationTree:
        """Every message with the selected child at each branch point."""

    async def select_message(
        self, conversation_id: str, user_id: str, message_id: str, *, org_id: str
    ) -> bool:
        """Put `message_id` on the current thread: select it and each of its ancestors.

        The thread then continues below it through the children selected
        there before. False if the conversation is not (`org_id`, `user_id`)'s or
        the message is not in it."""

    async def message_usage(self, conversation_id: str) -> list[TurnUsage]:
        """Prompt, cached and completion tokens of every answer, in seq order."""

    # --- context ------------------------------------------------------------------

    async def save_summary(
        self, conversation_id: str, through_message_id: str, content: str
    ) -> None:
        """Store (or replace) the summary of the thread ending at `through_message_id`."""

    async def list_summaries(self, conversation_id: str) -> list[Summary]:
        """Every summary of the conversation (any branch), oldest first."""

    async def save_embeddings(
        self, conversation_id: str, model: str, vectors: Mapping[str, bytes]
    ) -> None:
        """Cache message embeddings (message_id -> float32 bytes) computed by `model`."""

    async def load_embeddings(self, conversation_id: str, model: str) -> dict[str, bytes]:
        """The cached embeddings of the conversation's messages made by `model`."""

    # --- orgs and the response cache ----------------------------------------------

    async def set_org_settings(self, settings: OrgSettings) -> None:
        """Store (or replace) an org's settings."""

    async def get_org_settings(self, org_id: str) -> OrgSettings:
        """The org's settings; the defaults for an org never set."""

    async def list_org_settings(self) -> list[OrgSettings]:
        """Every org whose settings were set, by org_id."""

    async def put_cached_response(self, entry: CachedResponse) -> None:
        """Keep `entry` until its `expires_at`, replacing one under the same key."""

    async def get_cached_response(self, cache_key: str, org_id: str) -> CachedResponse | None:
        """The entry under `cache_key` if it is `org_id`'s and has not expired (store
        clock), else None."""

    # --- API keys -----------------------------------------------------------------

    async def add_api_key(self, key: str, owner: ApiKey) -> None:
        """Store the keyed hash of `key` with its row (`owner`: its key_id, or one derived
        from the hash when empty; its created_at, or the store clock's when 0).

        Idempotent: a key already stored, or a key_id already taken, keeps the row stored
        first. Needs the key secret (RuntimeError without one)."""

    async def find_api_key(self, key: str) -> ApiKey | None:
        """The row of `key` as stored, revoked or expired too (`ApiKey.refusal` decides);
        None if no such key. Needs the key secret."""

    async def list_api_keys(self) -> list[ApiKey]:
        """Every key's row (no secrets), oldest first."""

    async def revoke_api_key(self, key_id: str) -> bool:
        """Revoke the key at once (store clock); revoking it again keeps the first time.

        False if there is no key `key_id`."""


def owns(org_id: str, user_id: str, owner: ApiKey) -> bool:
    """Whether `owner` (a key's row) is the user `user_id` of org `org_id`: both must
    match, as the same user id may exist in two orgs. No org ("", a row from before
    orgs were kept) is nobody's."""
    return bool(org_id) and (org_id, user_id) == (owner.org_id, owner.user_id)


def check_answer_start(message: NewMessage, request: RequestRecord) -> None:
    """ValueError unless `message` is the IN_PROGRESS answer of `request`.

    Stores find a conversation's requests through its messages' request_id."""
    if message.status != RequestStatus.IN_PROGRESS:
        raise ValueError(f"answer {message.message_id} starts with status {message.status}")
    ids = (message.message_id, message.conversation_id, message.request_id)
    if ids != (request.message_id, request.conversation_id, request.request_id):
        raise ValueError(f"answer {message.message_id} is not the answer of {request}")


def hash_api_key(key: str, secret: bytes) -> str:
    """The stored form of an API key: hex HMAC-SHA256 under the deployment's key secret
    (CHATPIPE_KEY_SECRET), so a leaked table leaks no keys and, without the secret, lets
    no one test guesses against it. Another secret gives other hashes: rotating the
    secret invalidates every key.

    Rows stored by an earlier chatpipe hold a plain sha256 of the key: no HMAC ever
    equals one, so those keys no longer open (the stores show them revoked; the
    development key is stored again on every `chatpipe up`)."""
    return hmac.new(secret, key.encode(), hashlib.sha256).hexdigest()


KEY_ID_CHARS = 12
"""Length of a key_id a store derives from a key's hash (keys it did not name)."""


def derived_key_id(key_hash: str) -> str:
    """The key_id of a key stored without one: the start of its hash. A row from an
    earlier chatpipe (a sha256, no key_id) gets its id the same way."""
    return key_hash[:KEY_ID_CHARS]


class NoKeySecret(RuntimeError):
    """A store opened without the key secret was asked to hash a key."""

    def __init__(self) -> None:
        super().__init__("API keys need the key secret: set CHATPIPE_KEY_SECRET")


def encode_cursor(conversation: Conversation) -> str:
    """The cursor of the page after `conversation` (the last one of a page)."""
    raw = orjson.dumps([conversation.created_at, conversation.conversation_id])
    return base64.urlsafe_b64encode(raw).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    """(created_at, conversation_id) of the last conversation already listed.

    Raises ValueError on a cursor no store made."""
    try:
        created_at, conversation_id = orjson.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (binascii.Error, orjson.JSONDecodeError, TypeError, ValueError) as error:
        raise ValueError(f"invalid cursor {cursor!r}") from error
    if not isinstance(created_at, int | float) or not isinstance(conversation_id, str):
        raise ValueError(f"invalid cursor {cursor!r}")
    return float(created_at), conversation_id
