"""A conversation as a message tree with the selected branch at each fork.

Regenerating an answer adds an assistant sibling under the same user
message; editing a user message adds a user sibling under the same parent
(a fork) and the new answer continues below it. The thread the user sees —
and the prompt of the next turn — starts at the selected root and follows
the selected child of each message down to a leaf.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from conversations.store import StoredMessage
from schemas.events import Role

ROOT_KEY = ""
"""The key that stands for "no parent" (the conversation's first messages) in stored choices."""


def generated(message: StoredMessage) -> bool:
    """An answer the model generated (not an assistant message a client sent as input)."""
    return message.role == Role.ASSISTANT and message.request_id is not None


def parent_key(parent_id: str | None) -> str:
    """The stored key of a parent: its id, or `ROOT_KEY` for a root message."""
    return ROOT_KEY if parent_id is None else parent_id


@dataclass(frozen=True)
class ConversationTree:
    """Every message of a conversation and the child selected under each parent.

    `messages` are in seq order. `choices` maps a parent id (None for the
    roots) to the child chosen there; a parent without a valid choice shows
    its newest child.
    """

    messages: list[StoredMessage]
    choices: Mapping[str | None, str] = field(default_factory=dict)

    @classmethod
    def of(
        cls, messages: Iterable[StoredMessage], stored_choices: Mapping[str, str]
    ) -> ConversationTree:
        """Build from stored choices keyed by `parent_key`."""
        choices = {(None if k == ROOT_KEY else k): v for k, v in stored_choices.items()}
        return cls(sorted(messages, key=lambda m: m.seq), choices)

    def children(self, parent_id: str | None) -> list[StoredMessage]:
        """The messages directly below `parent_id` (None: the roots), oldest first."""
        return self._children.get(parent_id, [])

    @cached_property
    def _children(self) -> dict[str | None, list[StoredMessage]]:
        index: dict[str | None, list[StoredMessage]] = {}
        for message in self.messages:
            index.setdefault(message.parent_id, []).append(message)
        return index

    def selected_child(self, parent_id: str | None) -> StoredMessage | None:
        children = self.children(parent_id)
        chosen = self.choices.get(parent_id)
        for child in children:
            if child.message_id == chosen:
                return child
        return children[-1] if children else None

    @property
    def selected(self) -> dict[str | None, str]:
        """Parent id (None for the roots) -> selected child id, at every parent with children."""
        return {
            parent: child.message_id
            for parent in self._children
            if (child := self.selected_child(parent)) is not None
        }

    def thread(self) -> list[StoredMessage]:
        """The current branch: root first, following selected children to a leaf."""
        path: list[StoredMessage] = []
        seen: set[str] = set()
        node = self.selected_child(None)
        while node is not None and node.message_id not in seen:
            path.append(node)
            seen.add(node.message_id)
            node = self.selected_child(node.message_id)
        return path

    @property
    def leaf_id(self) -> str | None:
        """The last message of the current thread; a new turn's parent."""
        path = self.thread()
        return path[-1].message_id if path else None

    def path_to(self, message_id: str) -> list[StoredMessage]:
        """`message_id` and its ancestors, root first; empty if it is not in the tree."""
        by_id = {m.message_id: m for m in self.messages}
        path: list[StoredMessage] = []
        node = by_id.get(message_id)
        while node is not None and len(path) < len(by_id):
            path.append(node)
            node = by_id.get(node.parent_id) if node.parent_id is not None else None
        return path[::-1]

    def turn_inputs(self, answer_id: str) -> list[StoredMessage]:
        """The messages answer `answer_id` was asked with: those above it, root first,
        up to the generated answer before them (excluded); empty if it is not in the
        tree."""
        path = self.path_to(answer_id)[:-1]
        after = [index for index, message in enumerate(path) if generated(message)]
        return path[after[-1] + 1 :] if after else path
