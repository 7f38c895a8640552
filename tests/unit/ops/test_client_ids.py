"""The ids a client is shown, each naming its request (or the answer a request made)."""

from __future__ import annotations

import pytest

from ops.client_ids import ClientId, parse_client_id
from schemas.api import chat_completion_id, text_completion_id
from schemas.responses import response_id


@pytest.mark.parametrize(
    ("shown", "named"),
    [
        ("0f3a9c", ClientId(request_id="0f3a9c")),
        (chat_completion_id("0f3a9c"), ClientId(request_id="0f3a9c")),
        (text_completion_id("0f3a9c"), ClientId(request_id="0f3a9c")),
        (response_id("m7"), ClientId(message_id="m7")),
        ("emb-0f3a9c", ClientId(request_id="emb-0f3a9c")),
        ("chatcmpl-", ClientId(request_id="chatcmpl-")),
        ("resp_", ClientId(request_id="resp_")),
    ],
)
def test_each_id_a_client_sees_names_its_request_or_answer(shown, named):
    assert parse_client_id(shown) == named


def test_a_completion_id_is_its_request_id_prefixed():
    assert chat_completion_id("r1") == "chatcmpl-r1" and text_completion_id("r1") == "cmpl-r1"
