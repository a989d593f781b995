"""Example workflow files and the tools they use (``stepspec/workflows/examples/*.yaml``)."""
