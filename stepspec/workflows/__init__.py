"""User-facing entry points: YAML specs, the agent API, the CLI, datasets and graders."""
