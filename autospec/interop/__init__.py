"""Interoperability with other serving engines: export for vLLM, import speculators heads."""
