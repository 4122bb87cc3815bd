"""Domain prompt sets: reproducible, varied, chat-shaped; unknown domains are named."""

from __future__ import annotations

import pytest

from autospec.workloads import DOMAINS, SYNTHETIC, TRAFFIC, UnknownDomain, domain_prompts, part_of


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


@pytest.mark.parametrize("name", sorted(DOMAINS))
def test_traffic_and_synthetic_halves_never_share_a_prompt_whatever_the_seeds(name: str) -> None:
    traffic = {p[-1]["content"] for seed in (0, 1, 7919)
               for p in domain_prompts(name, 150, seed=seed)}
    synthetic = {p[-1]["content"] for seed in (0, 1, 7)
                 for p in domain_prompts(name, 150, seed=seed, part=SYNTHETIC)}
    assert len(synthetic) >= 150 and len(traffic) >= 150
    assert not traffic & synthetic
    assert domain_prompts(name, 20, seed=3) == domain_prompts(name, 20, seed=3, part=TRAFFIC)
    assert {part_of(p) for p in domain_prompts(name, 40, seed=3, part=SYNTHETIC)} == {SYNTHETIC}


def test_unknown_part_is_named() -> None:
    with pytest.raises(ValueError, match=r"traffic, synthetic, got 'heldout'"):
        domain_prompts("support", 3, part="heldout")
