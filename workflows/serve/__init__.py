"""``stepspec serve``: reasoners behind an OpenAI-compatible endpoint (:mod:`workflows.serve.app`)."""
