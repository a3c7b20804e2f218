"""The `ecstore` console script. cli.main and what it imports take a few tenths of a
second to load; a Ctrl-C in that time printed a KeyboardInterrupt traceback. Exit 130
then, as cli.main does for a Ctrl-C once it runs."""
from __future__ import annotations


def main() -> int:
    try:
        from cli.main import main as run
    except KeyboardInterrupt:
        return 130
    try:
        return run()
    except KeyboardInterrupt:   # in argument parsing, before run's own handler
        return 130
