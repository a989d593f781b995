"""Moved to :mod:`workflows.agents.agent`; this name stays so ``from workflows.agent import Agent`` keeps working."""

from workflows.agents.agent import Agent, AgentResult  # noqa: F401
