"""argparse types for the CLI's numbers: a value argparse's float() takes but the command
cannot use (nan, inf, a negative rate or interval) is refused when the command line is
read, with a usage message and exit 2 - not a traceback later, nor a node started first."""
from __future__ import annotations

import argparse
import math


def _number(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
    return value


def non_negative(text: str) -> float:
    """A finite number >= 0 (a rate where 0 means no limit, an age, a grace)."""
    value = _number(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}")
    return value


def count(text: str) -> int:
    """A whole number >= 1 (how many entries to show)."""
    if not text.isascii() or not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def positive(text: str) -> float:
    """A finite number > 0 (an interval, a window, a weight, a timeout)."""
    value = _number(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value
