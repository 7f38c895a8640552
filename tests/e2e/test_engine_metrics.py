"""vLLM's own engine metrics on chatpipe's /metrics, with the real engine.

vLLM's Prometheus stat logger takes the process's default registry over from any engine
started before it (`unregister_vllm_metrics`). A worker process runs one engine; the test
session runs the shared one and, in `test_engine_slots.py`, others after it: this file
sorts before that one so the shared engine's metrics are still the ones registered."""

from __future__ import annotations

import pytest

from tests.support.metrics import Samples, at, eventually, scrape, total
from tests.support.stack import client_for


@pytest.mark.vllm
async def test_the_real_engine_serves_vllm_metrics_beside_chatpipes(vllm_stack):
    """`chatpipe up` with vLLM: vLLM's own engine metrics (its Prometheus stat logger) on
    the same /metrics, and the engine's KV cache use in chatpipe's gauge."""
    url = f"{vllm_stack.base_url}/metrics"
    model = vllm_stack.settings.inference.model_name
    before = await scrape(url)
    async with client_for(vllm_stack) as client:
        answer = await client.post(
            "/v1/chat/completions",
            json={
                "model": model,
                "max_tokens": 8,
                "ignore_eos": True,
                "messages": [{"role": "user", "content": "count to eight"}],
            },
        )
    assert answer.status_code == 200, answer.text
    generated = "vllm:generation_tokens_total"

    def counted(samples: Samples) -> bool:
        # vLLM records a step's stats after handing its outputs on: the answer can reach
        # the client before its last step is counted.
        return (
            total(samples, generated, model_name=model) - total(before, generated, model_name=model)
        ) >= 8

    after = await eventually(url, counted, timeout_s=10.0)
    assert counted(after)
    assert any(name == "vllm:kv_cache_usage_perc" for name, _ in after)
    assert 0 <= at(after, "chatpipe:kv_cache_usage_perc", model=model) <= 1
    assert ("chatpipe:kv_cache_usage_perc", frozenset({("model", model)})) in after
    assert at(after, "chatpipe:worker_slots_max", model=model) >= 1
