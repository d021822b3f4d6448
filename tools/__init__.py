"""Checks the project runs on its own code: the import-linter contract types `make lint` adds."""
