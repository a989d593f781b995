"""Agents and the tools they call."""
