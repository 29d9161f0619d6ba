"""Benchmark targets: the embedded engine in-process, or an SGLang / OpenAI-compatible server."""
