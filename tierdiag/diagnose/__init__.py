"""Diagnosis: read a recorded run, say what happened and why. Reads the store only, never
starts a replay (app/advise.py does that, as a client of advice/'s rules).

Grouped by the question a module answers (each package's __init__ says why its modules are
together; docs/architecture.md says where a new one goes)::

    advice/     Advice: what to change in a run's config, each item a rule's, verified by a replay.
    comparison/ Runs side by side: `compare`, and what an SGLang upgrade moves rule by rule (`replay
                --sglang OLD,NEW`) with explain's upgrade step.
    dp/         A data-parallel run (`replay --dp N`): its ranks side by side, explain's routing
                step, and the once-cached tokens routing lost.
    read/       The read model of a run: what diagnose and report ask of a recorded run, typed.
    request/    One request's verdict: why its TTFT exceeded its ideal (`explain`'s four steps, its
                cause, its sentences), and `slow`, which ranks requests by that same verdict.
    run/        The run's story: its numbers, context and diagnosis, computed from its rows, stored
                with the run at its close (evidence, stored) and read back through the one reader
                (facts).
    session/    Sessions: whether a turn's context survived its pause, and the pool sizes that would
                keep it.
    twin/       An observed run (imported from a server's export) against its replayed twin:
                agreement, explain through the twin, the twin's TTFT error, and the cost-model clock
                fitted to it (calibrate).
    views.py    What each command asks of a run, answered by its kind's commands, chosen once from
                the run's view (read/kind.py): a replay from the engine's parts, an imported run ...
"""
