"""Fair share inside one tier: round robin over orgs, then over users, FIFO per user.

Every request costs one slot, so plain round robin is deficit round robin with
equal quanta: a user with 100 queued requests delays another user's single
request by at most one dispatch per org and user ahead of it in the rotation.

Push, peek and pop take constant time; `remove` looks only at its user's queue.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict, deque
from collections.abc import Iterator

from schemas.events import GenerationRequest

Users = OrderedDict[str, deque[GenerationRequest]]


class FairQueue:
    def __init__(self) -> None:
        self._orgs: OrderedDict[str, Users] = OrderedDict()
        self._owners: dict[str, tuple[str, str]] = {}  # request id -> (org, user)

    def __len__(self) -> int:
        return len(self._owners)

    def push(self, request: GenerationRequest, front: bool = False) -> None:
        """Queue `request`; `front` puts it first in its user's queue (a redispatch)."""
        users = self._orgs.setdefault(request.org_id, OrderedDict())
        queue = users.setdefault(request.user_id, deque())
        if front:
            queue.appendleft(request)
        else:
            queue.append(request)
        self._owners[request.request_id] = (request.org_id, request.user_id)

    def peek(self) -> GenerationRequest | None:
        for users in self._orgs.values():
            for queue in users.values():
                return queue[0]
        return None

    def pop(self) -> GenerationRequest:
        """The next request in fair order; its user and org go to the back."""
        request = _take_next(self._orgs)
        del self._owners[request.request_id]
        return request

    def take(self, request_id: str) -> GenerationRequest:
        """Take a queued request out as `pop` takes the first: its user and org go to
        the back (for the first, O(1); else O(its user's queue))."""
        org_id, user_id = self._owners[request_id]
        first = self.peek()
        if first is not None and first.request_id == request_id:
            return self.pop()
        request = self.remove(request_id)
        assert request is not None
        users = self._orgs.get(org_id)
        if users is not None:
            if user_id in users:
                users.move_to_end(user_id)
            self._orgs.move_to_end(org_id)
        return request

    def remove(self, request_id: str) -> GenerationRequest | None:
        owner = self._owners.pop(request_id, None)
        if owner is None:
            return None
        org_id, user_id = owner
        users = self._orgs[org_id]
        queue = users[user_id]
        index = next(i for i, r in enumerate(queue) if r.request_id == request_id)
        request = queue[index]
        del queue[index]
        if not queue:
            del users[user_id]
        if not users:
            del self._orgs[org_id]
        return request

    def first(self, count: int) -> list[GenerationRequest]:
        """The first `count` requests of `iter(self)`. While there are at least `count`
        orgs, in O(count) with nothing copied: each org has one turn, its first user's
        first request, before any has a second."""
        if len(self._orgs) < count:
            return list(itertools.islice(self, count))
        return [
            next(iter(users.values()))[0] for users in itertools.islice(self._orgs.values(), count)
        ]

    def __iter__(self) -> Iterator[GenerationRequest]:
        """Requests in the order `pop` would hand them out, without popping: the first
        k cost O(k). The walk copies each org's users and each user's queue when it
        first reaches them, so the queue may change meanwhile: what it yields then is
        the order as it was, and may hold requests no longer queued."""
        orgs = _Turns(tuple(self._orgs))
        users: dict[str, _Turns] = {}
        queues: dict[tuple[str, str], tuple[GenerationRequest, ...]] = {}
        taken: dict[tuple[str, str], int] = {}
        while orgs.left:
            org_id = orgs.take()
            turns = users.get(org_id)
            if turns is None:
                turns = users[org_id] = _Turns(tuple(self._orgs.get(org_id, ())))
            if turns.left:
                user_id = turns.take()
                key = (org_id, user_id)
                queue = queues.get(key)
                if queue is None:
                    org = self._orgs.get(org_id)
                    queue = queues[key] = tuple(org.get(user_id, ()) if org is not None else ())
                index = taken.get(key, 0)
                if index < len(queue):
                    yield queue[index]
                taken[key] = index + 1
                turns.done(user_id, more=index + 1 < len(queue))
            orgs.done(org_id, more=turns.left > 0)


class _Turns:
    """Keys in round robin: a key taken comes again after every other one while it
    has `more`."""

    def __init__(self, keys: tuple[str, ...]) -> None:
        self._first = iter(keys)
        self._again: deque[str] = deque()
        self.left = len(keys)

    def take(self) -> str:
        key = next(self._first, None)
        return self._again.popleft() if key is None else key

    def done(self, key: str, more: bool) -> None:
        if more:
            self._again.append(key)
        else:
            self.left -= 1


def _take_next(orgs: OrderedDict[str, Users]) -> GenerationRequest:
    org_id, users = next(iter(orgs.items()))
    user_id, queue = next(iter(users.items()))
    request = queue.popleft()
    users.move_to_end(user_id)
    if not queue:
        del users[user_id]
    orgs.move_to_end(org_id)
    if not users:
        del orgs[org_id]
    return request
