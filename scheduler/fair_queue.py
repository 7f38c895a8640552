"""Fair share inside one tier: round robin over orgs, then over users, FIFO per user.

Every request costs one slot, so plain round robin is deficit round robin with
equal quanta: a user with 100 queued requests delays another user's single
request by at most one dispatch per org and user ahead of it in the rotation.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterator

from schemas.events import GenerationRequest

Users = OrderedDict[str, deque[GenerationRequest]]


class FairQueue:
    def __init__(self) -> None:
        self._orgs: OrderedDict[str, Users] = OrderedDict()
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def push(self, request: GenerationRequest, front: bool = False) -> None:
        """Queue `request`; `front` puts it first in its user's queue (a redispatch)."""
        users = self._orgs.setdefault(request.org_id, OrderedDict())
        queue = users.setdefault(request.user_id, deque())
        if front:
            queue.appendleft(request)
        else:
            queue.append(request)
        self._size += 1

    def peek(self) -> GenerationRequest | None:
        for users in self._orgs.values():
            for queue in users.values():
                return queue[0]
        return None

    def pop(self) -> GenerationRequest:
        """The next request in fair order; its user and org go to the back."""
        self._size -= 1
        return _take_next(self._orgs)

    def remove(self, request_id: str) -> GenerationRequest | None:
        for org_id, users in self._orgs.items():
            for user_id, queue in users.items():
                for request in queue:
                    if request.request_id == request_id:
                        queue.remove(request)
                        self._size -= 1
                        if not queue:
                            del users[user_id]
                        if not users:
                            del self._orgs[org_id]
                        return request
        return None

    def __iter__(self) -> Iterator[GenerationRequest]:
        """Requests in the order `pop` would hand them out (without popping)."""
        orgs = OrderedDict(
            (org, OrderedDict((user, deque(queue)) for user, queue in users.items()))
            for org, users in self._orgs.items()
        )
        while orgs:
            yield _take_next(orgs)


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
