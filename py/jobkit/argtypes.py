"""argparse value types shared by the jobkit daemons (exporter, tb_bridge)."""

import argparse


def positive_seconds(text: str) -> float:
    """A number of seconds > 0, else argparse's usage error naming the value."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, got {text}")
    return value
