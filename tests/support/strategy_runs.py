"""Each registered strategy's run under its Python name, for tests:
``await specreason(question, target=..., draft=..., judge=..., **options)``."""

from stepspec.orchestrator.strategies import STRATEGIES

target_only = STRATEGIES["target-only"].run
draft_only = STRATEGIES["draft-only"].run
specreason = STRATEGIES["specreason"].run
lookahead = STRATEGIES["lookahead"].run
spec_thinking = STRATEGIES["spec-thinking"].run
arbitrage = STRATEGIES["arbitrage"].run
arbitrage_oracle = STRATEGIES["arbitrage-oracle"].run
tree = STRATEGIES["tree"].run
tree_target = STRATEGIES["tree-target"].run
best_of_n = STRATEGIES["best-of-n"].run
best_of_n_target = STRATEGIES["best-of-n-target"].run
