"""`python -m tierdiag ...`: the same command as the `tierdiag` console script (cli/main.py `entry`)."""

from tierdiag.cli.main import entry

if __name__ == "__main__":
    entry()
