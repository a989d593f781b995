"""YAML workflow files: their pydantic specs and the runner."""
