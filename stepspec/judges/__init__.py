"""Judges decide about a drafted reasoning step: score, semantic equivalence, cascades."""
