"""Evaluation: datasets, graders, the bench and its reports and run directories, the lm-eval model."""
