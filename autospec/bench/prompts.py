"""Fixed chat prompts for decode benchmarks and the demo: varied, realistic, short."""

from __future__ import annotations

BENCH_PROMPTS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "Rewrite this sentence in the passive voice: "
      "The support team resolved the customer's billing issue within two hours."}],
    [{"role": "user", "content": "Write a Python function that returns the sum of the "
      "squares of a list of integers, with a docstring."}],
    [{"role": "user", "content": "Extract the name, city and order number as JSON from: "
      "'Hi, this is Maria Lopez from Seattle, my order 48213 never arrived.'"}],
    [{"role": "user", "content": "What are three tips for staying focused while working "
      "from home?"}],
    [{"role": "user", "content": "Summarize in one sentence: Speculative decoding lets a "
      "small model propose several tokens that the large model verifies at once, which "
      "makes generation faster without changing the output."}],
    [{"role": "user", "content": "Translate to French: Where is the nearest train station?"}],
]
