"""A test-only vLLM worker extension: autospec's, plus a log of the drafts the model runner
proposes (``draft_log_start`` hooks it, ``draft_log`` returns and clears it)."""

from __future__ import annotations

from typing import Any

from autospec.interop.vllm_worker import AutospecWorkerExtension


class DraftLogExtension(AutospecWorkerExtension):
    def draft_log_start(self) -> bool:
        runner = self.model_runner
        runner._draft_log = []
        take = runner.take_draft_token_ids

        def logged(*args: Any, **kwargs: Any) -> Any:
            drafts = take(*args, **kwargs)
            if drafts is not None:
                runner._draft_log.append([[int(t) for t in row]
                                          for row in drafts.draft_token_ids])
            return drafts

        runner.take_draft_token_ids = logged
        return bool(self.vllm_config.cache_config.enable_prefix_caching)

    def draft_log(self) -> list[Any]:
        log, self.model_runner._draft_log = self.model_runner._draft_log, []
        return log
