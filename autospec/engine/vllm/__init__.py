"""The ``vllm`` engine: vLLM's ``AsyncLLM`` behind :class:`~autospec.engine.interface.Engine`
(:mod:`.engine`), its per-request figures in autospec's terms (:mod:`.stats`), autospec's
sampling settings as vLLM's (:mod:`.sampling`) and the in-place load of a new version
(:mod:`.swap`). vLLM itself is imported only where it is called (an optional dependency)."""
