"""Collecting routing data (which steps the target should write) for `stepspec router`."""
