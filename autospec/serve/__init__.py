"""Serving: an OpenAI-compatible Ray Serve application with speculative decoding, traffic
logging and hot-swap of the live speculator version.

- :mod:`~autospec.serve.config`: :class:`ServeConfig` (strict), the built-in version names;
- :mod:`~autospec.serve.versions`: the version a replica serves, the live-pointer watcher
  (:mod:`~autospec.serve.vllm_versions` on vLLM);
- :mod:`~autospec.serve.server`: :class:`LLMServer`, the plain core for every engine (no Ray,
  no HTTP), holding what its engine brings (:mod:`~autospec.serve.engines`: versions, a
  decoder — :mod:`~autospec.serve.decode`, :mod:`~autospec.serve.vllm_decode` — and vLLM's
  OpenAI layer);
- :mod:`~autospec.serve.http`: the FastAPI app (routes, SSE; :mod:`~autospec.serve.http_io`:
  body parsing and headers, shared with :mod:`~autospec.serve.vllm_http`);
- :mod:`~autospec.serve.schemas` / :mod:`~autospec.serve.errors`: OpenAI shapes;
- :mod:`~autospec.serve.metrics`: Prometheus reporter;
- :mod:`~autospec.serve.app`: the Ray Serve deployment and ``build_app``;
- :mod:`~autospec.serve.cli`: ``autospec serve``.

Knows nothing of training. Heavy imports (torch, ray) happen in the submodules.
"""
