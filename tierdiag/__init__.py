"""tierdiag: diagnostics for tiered LLM KV caches."""

__version__ = "0.1.0"
