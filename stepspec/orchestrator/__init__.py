"""The step-level loop and its strategies, traces, budgets and metrics."""
