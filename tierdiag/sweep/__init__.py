"""Sweeps: many replays of one trace under different configurations (DESIGN §5).

    spec.py    `--set KEY=V1,V2` -> the cartesian product of validated EngineConfigs, named
    runner.py  run_configs(): replay each config in parallel processes or as Ray tasks and
               record every run into one store under one sweep_id
    merge.py   a finished run's tables (Arrow) -> the store, one transaction per run

The runner knows nothing of advice or comparison: `advise` is a client of it, `compare` a
reader of what it wrote.
"""
