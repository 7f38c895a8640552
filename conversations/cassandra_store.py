"""The conversation store on Cassandra, for a distributed deployment: tables in `cassandra_schema`.

The store's logic talks to a `CqlSession` (`cassandra_session`): prepared
statements run with the driver's `execute_async`, bridged to asyncio.

Seq assignment: a message's seq is claimed with a conditional batch on its
conversation's partition — the message row plus `UPDATE … SET last_seq = n
IF last_seq = n - 1` on the partition's static counter. Paxos lets exactly
one writer take each seq; a loser learns the current `last_seq` from the
refusal and tries the next one (`claim_seq`). Seqs stay dense (1, 2, 3, …)
and ordered like SQLite's, with one LWT per message; a time-based clustering
key would need none, but could not be idempotent on message_id nor tell a
client "the 7th message". Idempotency: a stored message_id is found through
`message_ids` and returned unchanged; two writers racing with the same id
both claim a seq, and the loser of `INSERT … IF NOT EXISTS` on `message_ids`
deletes its copy (and reads dedupe by message_id should it die first).

A streaming answer (`start_answer`) is finished with `UPDATE … IF status =
'in_progress'`: Paxos lets one writer finish it, and a row deleted meanwhile
is not written again.

API keys: hashed under the `key_secret` the store is given (without one it can
list and revoke keys, not add or find one). A key's id row (`api_key_ids`) is
written before its key row, so a key never lists without an id to revoke it by;
should a writer die in between, the id row points at no key and the key was not
added (adding it again completes it).

Create the schema with `chatpipe store create-schema` (`create_schema` here), or let
`open()` do it (`create_schema=True`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Collection, Mapping
from dataclasses import astuple, replace

from conversations import cassandra_schema as cql
from conversations.cassandra_files import CassandraFiles
from conversations.cassandra_orgs import CassandraOrgs
from conversations.cassandra_session import CqlSession, DriverSession, Rows
from conversations.store import (
    ApiKey,
    Conversation,
    ConversationPage,
    NewMessage,
    NoKeySecret,
    RequestRecord,
    StoredMessage,
    Summary,
    TurnUsage,
    branch_ends,
    check_answer_start,
    decode_cursor,
    derived_key_id,
    encode_cursor,
    hash_api_key,
)
from conversations.tree import ConversationTree, parent_key
from schemas.lifecycle import RequestStatus

MAX_SEQ_CLAIMS = 1000


async def claim_seq(
    try_claim: Callable[[int, int | None], Awaitable[tuple[bool, int | None]]],
    last_seq: int | None,
    max_claims: int = MAX_SEQ_CLAIMS,
) -> int:
    """The seq this writer won: the first `last_seq + 1` that `try_claim` takes.

    `try_claim(seq, expected_last)` runs the conditional write and returns
    (applied, the partition's current last_seq); on a refusal the next
    attempt starts from that value, so each retry costs one round.
    """
    for _ in range(max_claims):
        seq = (last_seq or 0) + 1
        won, current = await try_claim(seq, last_seq)
        if won:
            return seq
        last_seq = current
    raise RuntimeError(f"no seq claimed after {max_claims} attempts")


class CassandraStore(CassandraOrgs, CassandraFiles):
    """`ConversationStore` on a Cassandra cluster."""

    def __init__(
        self,
        hosts: list[str],
        keyspace: str = "chatpipe",
        *,
        create_schema: bool = True,
        replication_factor: int = 1,
        key_secret: bytes | None = None,
        clock: Callable[[], float] = time.time,
        connect: Callable[[], Awaitable[CqlSession]] | None = None,
    ) -> None:
        """`connect` replaces the driver (tests); by default `DriverSession.connect`."""
        self._key_secret = key_secret
        self._connect = connect or (
            lambda: DriverSession.connect(
                hosts, keyspace, create_schema=create_schema,
                replication_factor=replication_factor,
            )
        )  # fmt: skip
        self._clock = clock
        self._session: CqlSession | None = None

    async def open(self) -> None:
        if self._session is None:
            self._session = await self._connect()

    async def close(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()

    # --- conversations ------------------------------------------------------------

    async def create_conversation(
        self, conversation_id: str, user_id: str, title: str = "", *, org_id: str
    ) -> Conversation:
        new = Conversation(conversation_id, user_id, title, self._clock(), org_id=org_id)
        rows = await self._run("insert_conversation", cql.conversation_values(new))
        stored = new if cql.applied(rows) else cql.conversation_of(rows[0])
        # also on a repeat: repairs the list entry if the first try died in between
        await self._run("insert_conversation_by_owner", cql.conversation_values(stored))
        return stored

    async def get_conversation(self, conversation_id: str) -> Conversation | None:
        rows = await self._run("select_conversation", (conversation_id,))
        return cql.conversation_of(rows[0]) if rows else None

    async def list_conversations(
        self, user_id: str, *, org_id: str, limit: int = 50, cursor: str | None = None
    ) -> ConversationPage:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        owner = (org_id, user_id)
        if cursor is None:
            rows = await self._run("page_first", (*owner, limit + 1))
        else:
            created_at, conversation_id = decode_cursor(cursor)
            rows = await self._run("page_ties", (*owner, created_at, conversation_id, limit + 1))
            if len(rows) <= limit:
                older = limit + 1 - len(rows)
                rows += await self._run("page_older", (*owner, created_at, older))
        page = [cql.conversation_of(row) for row in rows[:limit]]
        return ConversationPage(page, encode_cursor(page[-1]) if len(rows) > limit else None)

    async def rename_conversation(
        self, conversation_id: str, user_id: str, title: str, *, org_id: str
    ) -> Conversation | None:
        found = await self._owned(conversation_id, org_id, user_id)
        if found is None:
            return None
        owner = (org_id, user_id)
        if not cql.applied(await self._run("rename", (title, conversation_id, *owner))):
            return None  # deleted meanwhile
        await self._run("rename_by_owner", (title, *owner, found.created_at, conversation_id))
        return replace(found, title=title)

    async def set_auto_title(self, conversation_id: str, title: str) -> None:
        found = await self.get_conversation(conversation_id)
        if found is None:
            return
        await self._run("auto_title", (title, conversation_id))
        await self._run(
            "auto_title_by_owner",
            (title, found.org_id, found.user_id, found.created_at, conversation_id),
        )

    async def delete_conversation(self, conversation_id: str, user_id: str, *, org_id: str) -> bool:
        found = await self._owned(conversation_id, org_id, user_id)
        if found is None:
            return False
        owner = (org_id, user_id)
        if not cql.applied(await self._run("delete_conversation", (conversation_id, *owner))):
            return False
        await self._run("delete_conversation_by_owner", (*owner, found.created_at, conversation_id))
        messages = await self.list_messages(conversation_id)
        await asyncio.gather(
            *(self._run("delete_message_id", (m.message_id,)) for m in messages),
            *(self._run("delete_request", (m.request_id,)) for m in messages if m.request_id),
            *(
                self._run(name, (conversation_id,))
                for name in (
                    "delete_messages",
                    "delete_summaries",
                    "delete_embeddings",
                    "delete_citations",
                    "delete_tool_steps",
                )
            ),
        )
        return True

    # --- messages -----------------------------------------------------------------

    async def add_message(self, message: NewMessage) -> StoredMessage:
        found = await self.get_message(message.message_id)
        if found is not None:
            return found
        return await self._append(_stored(message, seq=0, created_at=self._clock()))

    async def _append(self, stored: StoredMessage) -> StoredMessage:
        """Store a new message: claim its seq, select it, index its id (module docstring)."""
        key = parent_key(stored.parent_id)

        async def try_claim(seq: int, expected: int | None) -> tuple[bool, int | None]:
            row = _with_seq(stored, seq)
            rows = await self._batch(
                [
                    ("insert_message", cql.message_values(row)),
                    ("claim_seq", (seq, key, stored.message_id, stored.conversation_id, expected)),
                ]
            )
            if cql.applied(rows):
                return True, seq
            current = rows[0].get("last_seq") if rows else None
            return False, current if current is not None else await self._last_seq(stored)

        seq = await claim_seq(try_claim, await self._last_seq(stored))
        stored = _with_seq(stored, seq)
        rows = await self._run(
            "insert_message_id", (stored.message_id, stored.conversation_id, seq)
        )
        if cql.applied(rows) or rows[0]["seq"] == seq:
            return stored
        # a concurrent writer stored this message_id first: drop our copy, return its
        await self._run("delete_message", (stored.conversation_id, seq))
        winner = await self._run("select_message", (rows[0]["conversation_id"], rows[0]["seq"]))
        return cql.message_of(winner[0]) if winner else stored

    async def _last_seq(self, message: StoredMessage) -> int | None:
        rows = await self._run("select_last_seq", (message.conversation_id,))
        return rows[0]["last_seq"] if rows else None

    async def delete_messages(self, conversation_id: str, message_ids: Collection[str]) -> int:
        doomed = branch_ends(await self.list_messages(conversation_id), message_ids)
        if not doomed:
            return 0
        gone = {m.message_id for m in doomed}
        embedded = await self._run("select_embedding_keys", (conversation_id,))
        await asyncio.gather(
            *(self._run("delete_message", (conversation_id, m.seq)) for m in doomed),
            *(self._run("delete_message_id", (m.message_id,)) for m in doomed),
            *(self._run("delete_request", (m.request_id,)) for m in doomed if m.request_id),
            *(
                self._run(name, (conversation_id, m.message_id))
                for m in doomed
                for name in (
                    "delete_summary",
                    "delete_message_citations",
                    "delete_message_tool_steps",
                )
            ),
            *(
                self._run("delete_embedding", (conversation_id, row["model"], row["message_id"]))
                for row in embedded
                if row["message_id"] in gone
            ),
        )
        # The choices made below a deleted message; one naming a deleted child is
        # harmless (its parent shows its newest child).
        await self._run("remove_choices", (gone, conversation_id))
        return len(doomed)

    async def get_message(self, message_id: str) -> StoredMessage | None:
        key = await self._message_key(message_id)
        if key is None:
            return None
        rows = await self._run("select_message", key)
        return cql.message_of(rows[0]) if rows and rows[0].get("message_id") else None

    async def _message_key(self, message_id: str) -> tuple[str, int] | None:
        """(conversation_id, seq) of a stored message, from `message_ids`."""
        ids = await self._run("select_message_id", (message_id,))
        if not ids or ids[0]["seq"] is None:
            return None
        return ids[0]["conversation_id"], ids[0]["seq"]

    async def start_answer(self, message: NewMessage, request: RequestRecord) -> StoredMessage:
        check_answer_start(message, request)
        found = await self.get_message(message.message_id)
        if found is not None:
            return found
        stored = _stored(message, seq=0, created_at=self._clock())
        # the request first: a retry after a crash in between finds no message and
        # stores both; the other order would leave a message without its request
        await self._run("insert_request", astuple(replace(request, created_at=stored.created_at)))
        return await self._append(stored)

    async def finish_answer(self, message: NewMessage) -> bool:
        key = await self._message_key(message.message_id)
        if key is None:
            return False
        m = message
        final = (m.content, m.tokens, m.prompt_tokens, m.cached_tokens, m.model, m.status.value)
        rows = await self._run("finish_answer", (*final, *key, RequestStatus.IN_PROGRESS.value))
        return cql.applied(rows)

    async def get_request(self, request_id: str) -> RequestRecord | None:
        rows = await self._run("select_request", (request_id,))
        if not rows:
            return None
        return RequestRecord(**{**rows[0], "org_id": rows[0].get("org_id") or ""})

    async def in_progress_requests(self, conversation_id: str) -> list[str]:
        return [
            m.request_id for m in await self.list_messages(conversation_id)
            if m.status == RequestStatus.IN_PROGRESS and m.request_id
        ]  # fmt: skip

    async def list_messages(self, conversation_id: str) -> list[StoredMessage]:
        return cql.messages_of(await self._run("select_messages", (conversation_id,)))

    async def get_tree(self, conversation_id: str) -> ConversationTree:
        rows = await self._run("select_messages", (conversation_id,))
        return ConversationTree.of(cql.messages_of(rows), cql.choices_of(rows))

    async def select_message(
        self, conversation_id: str, user_id: str, message_id: str, *, org_id: str
    ) -> bool:
        if await self._owned(conversation_id, org_id, user_id) is None:
            return False
        path = ConversationTree(await self.list_messages(conversation_id)).path_to(message_id)
        if not path:
            return False
        choices = {parent_key(m.parent_id): m.message_id for m in path}
        return cql.applied(await self._run("add_choices", (choices, conversation_id)))

    async def message_usage(self, conversation_id: str) -> list[TurnUsage]:
        return cql.usage_of(await self.list_messages(conversation_id))

    # --- context ------------------------------------------------------------------

    async def save_summary(
        self, conversation_id: str, through_message_id: str, content: str
    ) -> None:
        await self._run(
            "insert_summary", (conversation_id, through_message_id, content, self._clock())
        )

    async def list_summaries(self, conversation_id: str) -> list[Summary]:
        return cql.summaries_of(await self._run("select_summaries", (conversation_id,)))

    async def save_embeddings(
        self, conversation_id: str, model: str, vectors: Mapping[str, bytes]
    ) -> None:
        # one write each: a batch of many vectors passes Cassandra's batch size limit
        await asyncio.gather(
            *(
                self._run("insert_embedding", (conversation_id, model, message_id, vector))
                for message_id, vector in vectors.items()
            )
        )

    async def load_embeddings(self, conversation_id: str, model: str) -> dict[str, bytes]:
        rows = await self._run("select_embeddings", (conversation_id, model))
        return {row["message_id"]: bytes(row["vector"]) for row in rows}

    # --- API keys -----------------------------------------------------------------

    async def add_api_key(self, key: str, owner: ApiKey) -> None:
        key_hash = self._hash(key)
        row = replace(owner, key_id=owner.key_id or derived_key_id(key_hash),
                      created_at=owner.created_at or self._clock())  # fmt: skip
        taken = await self._run("insert_api_key_id", (row.key_id, key_hash))
        if not cql.applied(taken) and taken[0].get("key_hash") != key_hash:
            return  # the id is another key's: the first one keeps it
        await self._run("insert_api_key", cql.api_key_values(key_hash, row))

    async def find_api_key(self, key: str) -> ApiKey | None:
        rows = await self._run("select_api_key", (self._hash(key),))
        return cql.api_key_of(rows[0]) if rows and rows[0].get("user_id") else None

    async def list_api_keys(self) -> list[ApiKey]:
        rows = await self._run("select_api_keys", ())
        keys = [cql.api_key_of(row) for row in rows if row.get("user_id")]
        return sorted(keys, key=lambda k: (k.created_at, k.key_id))

    async def revoke_api_key(self, key_id: str) -> bool:
        ids = await self._run("select_api_key_id", (key_id,))
        if not ids:
            return False
        key_hash = ids[0]["key_hash"]
        rows = await self._run("select_api_key", (key_hash,))
        # the id row of a key whose own row was never written, or another key's row
        # (an id taken by a second add of the same key): not this key
        if not rows or rows[0].get("key_id") != key_id:
            return False
        if rows[0].get("revoked_at") is None:
            await self._run("revoke_api_key", (self._clock(), key_hash))
        return True

    # --- plumbing -----------------------------------------------------------------

    async def _owned(self, conversation_id: str, org_id: str, user_id: str
                     ) -> Conversation | None:  # fmt: skip
        """The conversation, if it is (`org_id`, `user_id`)'s."""
        found = await self.get_conversation(conversation_id)
        if found is None or not org_id or (found.org_id, found.user_id) != (org_id, user_id):
            return None
        return found

    def _hash(self, key: str) -> str:
        if self._key_secret is None:
            raise NoKeySecret()
        return hash_api_key(key, self._key_secret)

    async def _run(self, name: str, values: tuple) -> Rows:
        if self._session is None:
            raise RuntimeError("CassandraStore is not open")
        return await self._session.run(name, values)

    async def _batch(self, statements: list[tuple[str, tuple]]) -> Rows:
        if self._session is None:
            raise RuntimeError("CassandraStore is not open")
        return await self._session.batch(statements)


def _stored(message: NewMessage, seq: int, created_at: float) -> StoredMessage:
    return StoredMessage(
        message_id=message.message_id,
        conversation_id=message.conversation_id,
        seq=seq,
        role=message.role,
        content=message.content,
        parent_id=message.parent_id,
        model=message.model,
        tokens=message.tokens,
        status=message.status,
        request_id=message.request_id,
        created_at=created_at,
        prompt_tokens=message.prompt_tokens,
        cached_tokens=message.cached_tokens,
        alias=message.alias,
    )


def _with_seq(message: StoredMessage, seq: int) -> StoredMessage:
    return replace(message, seq=seq)


async def create_schema(hosts: list[str], keyspace: str, replication_factor: int = 1) -> None:
    """Create the keyspace and tables (idempotent): the deployment's one-off schema job."""
    session = await DriverSession.connect(
        hosts, keyspace, create_schema=True, replication_factor=replication_factor
    )
    await session.close()
