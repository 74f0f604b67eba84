"""Remediations: turn findings into runtime, persistent and rollback steps."""
