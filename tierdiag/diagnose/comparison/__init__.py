"""Runs side by side: `compare`, and what an SGLang upgrade moves rule by rule
(`replay --sglang OLD,NEW`) with explain's upgrade step.

    compare.py       `compare`: runs side by side, and one request in two runs.
    upgrade.py       What an SGLang upgrade moves, rule by rule: the runs of `replay TRACE ...
    upgrade_step.py  explain's upgrade step: one request of NEW's run of an upgrade sweep ...
"""
