"""Integrations with runtimes and frameworks: AWS Lambda, HTTP servers."""
