"""The compiled CPU data plane (_cplane.c) behind one facade (cplane.py). The bottom layer:
imports nothing of tierdiag but errors."""
