"""The policy's ``training.synthetic`` section: off by default, validated by name, wired."""

import pytest

from autospec.controller.policy import SHIPPED, PolicyError, load_policy, parse_policy


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_policies_keep_synthetic_data_off(name):
    syn = load_policy(name).training.synthetic
    assert syn.share == 0.0 and syn.heldout_sequences == 64
    assert syn.mix() is None


def test_a_share_becomes_the_training_mix():
    policy = parse_policy("training:\n  synthetic: {share: 0.3, sources: [resampled, "
                          "domain:coding], max_sequences: 500}\n")
    mix = policy.training.synthetic.mix()
    assert (mix.share, mix.sources, mix.max_sequences) == (0.3, ("resampled", "domain:coding"),
                                                           500)
    assert mix.wanted(70) == 30


@pytest.mark.parametrize(("text", "message"), [
    ("training:\n  synthetic: {share: 0.95}\n",
     "training.synthetic.share: Input should be less than or equal to 0.9"),
    ("training:\n  synthetic: {sources: [traffic]}\n",
     "training.synthetic.sources: 'traffic' is not a source"),
    ("training:\n  synthetic: {shares: 0.1}\n", "training.synthetic.shares: unknown field"),
])
def test_bad_synthetic_settings_name_the_field(text, message):
    with pytest.raises(PolicyError, match=message.replace(".", r"\.")):
        parse_policy(text, source="p.yaml")
