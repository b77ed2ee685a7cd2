"""What a replay is configured with, and every name and default a user can type: EngineConfig,
the router's keys, the model/GPU presets, the eviction-policy registry, the names of policies and
of what rows hold (names.py), and `--set` sweep specs. Below the engine and the store; imports
neither (the engine registers its implementations under these names)."""
