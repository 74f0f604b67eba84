"""Helpers shared by several checks: facts read through the Host seam, pure parsers."""
