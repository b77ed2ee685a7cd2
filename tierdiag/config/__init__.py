"""What a replay is configured with: EngineConfig, the model/GPU presets, the eviction-policy
registry, and `--set` sweep specs. Below the engine and the store; imports neither."""
