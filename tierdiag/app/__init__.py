"""Orchestration: a replay with its close, the sweep runner, advise. Drives the engine and the
store; computes nothing of its own (docs/architecture.md)."""
