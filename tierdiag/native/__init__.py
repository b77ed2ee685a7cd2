"""The compiled CPU data plane (_cplane.c) behind one facade (cplane.py), and diagnose's two
passes at a run's close, each with its Python reference: the size curves' LRU stack depths
(_stackdist, stackdist/) and the session pauses' sweep (_sessions, sessions/). The bottom layer:
imports nothing of tierdiag but errors."""
