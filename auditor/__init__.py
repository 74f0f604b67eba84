"""host-auditor: audit and tune GPU / LLM-inference Linux hosts."""

__version__ = "0.1.0"
