"""Jinja templates for reports and fix scripts (package data)."""
