"""Domain prompt sets: reproducible, varied, chat-shaped; unknown domains are named."""

from __future__ import annotations

import pytest

from autospec.workloads import DOMAINS, UnknownDomain, domain_prompts


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_domain_prompts_are_reproducible_varied_chats(name: str) -> None:
    prompts = domain_prompts(name, 200, seed=1)
    assert prompts == domain_prompts(name, 200, seed=1)
    assert prompts != domain_prompts(name, 200, seed=2)
    assert domain_prompts(name, 50, seed=1) == prompts[:50]  # a prefix of a longer draw
    users = [p[-1]["content"] for p in prompts]
    assert len(set(users)) == 200  # no exact repeats
    assert all(p[0]["role"] == "system" and p[-1]["role"] == "user" for p in prompts)
    words = {w for u in users for w in u.split()}
    assert len(words) > 150  # built from varied parts, not one template


def test_unknown_domain_lists_the_known_ones() -> None:
    with pytest.raises(UnknownDomain, match="coding, json, support"):
        domain_prompts("legal", 3)
