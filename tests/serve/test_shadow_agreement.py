"""Live vs shadow: requests served through the API with version V, logged by the real
writer, then shadow-evaluated with V — the τ agree within 2 % (greedy).
Tiny random-init Llama with the default target's tokenizer."""

from __future__ import annotations

from autospec.evaluate.run import evaluate_versions, select_requests
from autospec.versions import BUILTIN_VERSION

PROMPTS = ["Hello there", "Tell me a story about a cat", "1, 2, 3, 4,", "The weather is",
           "Write a list", "Repeat: abc abc abc"]


def test_shadow_tau_agrees_with_live_tau_within_2_percent(client, server, db, tiny_llm):
    live_accepted = live_steps = 0
    for text in PROMPTS:
        body = client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": text}], "max_tokens": 24,
            "temperature": 0}).json()
        assert body["autospec"]["version"] == BUILTIN_VERSION
        live_accepted += body["autospec"]["num_accepted_tokens"]
        live_steps += body["autospec"]["num_drafts"]
    assert server.writer.flush(10)
    live_tau = (live_accepted + live_steps) / live_steps
    examples = select_requests(db, last=100)
    assert len(examples) == len(PROMPTS)
    report = evaluate_versions(db=db, target=tiny_llm, versions=[BUILTIN_VERSION],
                               examples=examples, k=server.config.speculator_k, record=False)
    shadow_tau = report.evaluation.tau[BUILTIN_VERSION]
    assert abs(shadow_tau - live_tau) <= 0.02 * live_tau, (live_tau, shadow_tau)
    print(f"live τ {live_tau:.4f}, shadow τ {shadow_tau:.4f}")
