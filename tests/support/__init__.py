"""What every test folder shares: the one way to run the CLI in a subprocess (cli.py) and to
write a trace (traces.py)."""
