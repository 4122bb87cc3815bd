"""Serving: an OpenAI-compatible Ray Serve application with speculative decoding, traffic
logging and hot-swap of the live speculator version.

- :mod:`~autospec.serve.config`: :class:`ServeConfig` (strict), the built-in version names;
- :mod:`~autospec.serve.versions`: the version a replica serves, the live-pointer watcher;
- :mod:`~autospec.serve.server`: :class:`LLMServer`, the plain core (no Ray, no HTTP);
- :mod:`~autospec.serve.http`: the FastAPI app (routes, body parsing, SSE);
- :mod:`~autospec.serve.schemas` / :mod:`~autospec.serve.errors`: OpenAI shapes;
- :mod:`~autospec.serve.metrics`: Prometheus reporter;
- :mod:`~autospec.serve.app`: the Ray Serve deployment and ``build_app``;
- :mod:`~autospec.serve.cli`: ``autospec serve``.

Knows nothing of training. Heavy imports (torch, ray) happen in the submodules.
"""
