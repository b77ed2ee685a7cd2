"""Diagnosis: read a recorded run, say what happened and why. Reads the store only, never
starts a replay (app/advise.py does that, as a client of advice/'s rules).

Modules, each importing only those below it (an arrow reads "is built on")::

    explain -> explain_steps, explain_verdict -> explain_result      one request
    explain -> routing -> ranks                                      a --dp run: the routing step; ranks side by side
    observed -> observed_explain -> observed_twin                    imported (server) runs
    compare, observed_explain -> twin_error                          a twin's TTFT error, its clock
    slow_groups -> explain, slow                                     the report's slowest table
    summary -> diagnosis -> advice/ -> run_claims, claims           the run's root cause, what to change: one rule
                                                                     a module (advice/rules/), listed in registry.py
    compare, slow                                                    runs side by side; ranking
    calibrate -> fit, twin_error                                     a cost model fitted to an observed run
    evidence                     computes and stores at the close (close.py: the store's hook)
    facts                        the ONE reader of stored evidence: stored, else computed
      -> stored                  the row's format
         -> runcontext, numbers, totals                              computed from the rows
            runcontext -> story, capacity    the requests' own verdicts by excess; offered prefill vs GPU
            runcontext, run_claims -> routing_loss  once-cached tokens lost to routing (a dp run's), priced by position
    context (one request's surroundings) . causes . tokens . sql . quantile . query
    read/    the read model: Run (the runs row parsed once: kind, rules, ranks), one view per run
             kind (kind.py: the one branch on it), RequestRow (a typed `requests` row), and the
             named queries (queries.py: `request`, `slowest`, ...); built on sql, below them all

Nothing below `facts` reads the stored row; `evidence` writes it and never reads it back.
"""
