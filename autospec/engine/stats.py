"""Per-request speculative-decoding statistics. Stats collect; reporters report.

A **step** is one target forward after the prompt: it verifies the ``d`` draft tokens
proposed for it (``d`` may be 0 when the speculator had nothing to propose, or with no
speculator at all) and yields ``accepted + 1`` tokens, the one being the recovered or
bonus token. The **acceptance length** τ is the mean over steps of ``accepted + 1``
(bonus included, as vLLM reports it), so τ is also output tokens per target forward.
Prometheus, logs and the database all read these fields; :func:`tau` is the one formula
(every other module calls it; ``tests/engine/test_tau_once.py`` greps for a second one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


def tau(accepted: float, steps: int) -> float | None:
    """Acceptance length over ``steps`` target forwards that accepted ``accepted`` draft
    tokens in all (a float where it is an expectation, as in shadow replay):
    ``(accepted + steps) / steps``. ``None`` when there was no step (no measurement, not a
    τ of 1): a caller that needs a number decides what stands in for it, in the open."""
    return (accepted + steps) / steps if steps else None


@dataclass
class RequestStats:
    """What one request did; ``observe_*`` methods are the only writers."""

    prompt_tokens: int = 0
    output_tokens: int = 0
    num_drafts: int = 0  # verification steps (target forwards after the prompt)
    num_draft_tokens: int = 0  # draft tokens proposed, over all steps
    num_accepted_tokens: int = 0  # draft tokens accepted, over all steps
    accepted_per_position: list[int] = field(default_factory=list)  # [k]: accepted at draft i
    ttft_s: float = 0.0  # time to the first output token
    total_s: float = 0.0

    def observe_step(self, num_proposed: int, num_accepted: int, depth: int | None = None) -> None:
        """One step; ``depth``: the deepest draft's position (a tree's depth; a chain's
        is ``num_proposed``)."""
        assert 0 <= num_accepted <= (num_proposed if depth is None else depth) <= num_proposed
        self.num_drafts += 1
        self.num_draft_tokens += num_proposed
        self.num_accepted_tokens += num_accepted
        missing = (num_proposed if depth is None else depth) - len(self.accepted_per_position)
        if missing > 0:
            self.accepted_per_position.extend([0] * missing)
        for i in range(num_accepted):
            self.accepted_per_position[i] += 1

    def uncount_accepted(self, counted: int, kept: int) -> None:
        """The last step counted ``counted`` accepted drafts of which only the first ``kept``
        were emitted (the output ended at one of them)."""
        assert 0 <= kept <= counted <= len(self.accepted_per_position)
        self.num_accepted_tokens -= counted - kept
        for i in range(kept, counted):
            self.accepted_per_position[i] -= 1

    @classmethod
    def merged(cls, parts: list[RequestStats]) -> RequestStats:
        """One request's figures over several sequences (``n > 1`` choices): counts summed
        (the prompt counted once), so ``tau`` is over all their steps."""
        width = max((len(p.accepted_per_position) for p in parts), default=0)
        per_position = [sum(p.accepted_per_position[i] for p in parts
                            if i < len(p.accepted_per_position)) for i in range(width)]
        return cls(prompt_tokens=parts[0].prompt_tokens if parts else 0,
                   output_tokens=sum(p.output_tokens for p in parts),
                   num_drafts=sum(p.num_drafts for p in parts),
                   num_draft_tokens=sum(p.num_draft_tokens for p in parts),
                   num_accepted_tokens=sum(p.num_accepted_tokens for p in parts),
                   accepted_per_position=per_position,
                   ttft_s=min((p.ttft_s for p in parts), default=0.0),
                   total_s=max((p.total_s for p in parts), default=0.0))

    @property
    def tau(self) -> float | None:
        """Acceptance length: mean over steps of accepted + 1 (:func:`tau`); None before any
        step (a request of one output token has none)."""
        return tau(self.num_accepted_tokens, self.num_drafts)

    @property
    def drafts_per_step(self) -> float | None:
        """Draft tokens proposed per step; None before any step."""
        return self.num_draft_tokens / self.num_drafts if self.num_drafts else None

    @property
    def acceptance_rate(self) -> float:
        """Accepted draft tokens / proposed draft tokens."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.total_s if self.total_s > 0 else 0.0

    def as_dict(self) -> dict:
        return {**asdict(self), "tau": self.tau, "acceptance_rate": self.acceptance_rate}
