"""``stepspec serve``: reasoners behind an OpenAI-compatible endpoint (:mod:`stepspec.workflows.serve.app`)."""
