"""Small helpers every layer uses: atomic file writes, tolerant JSONL reading, name suggestions."""
