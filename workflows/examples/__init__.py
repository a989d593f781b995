"""Example workflow files and the tools they use (``workflows/examples/*.yaml``)."""
