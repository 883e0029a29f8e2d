"""Measuring: bench, the concurrency lab, their metrics and reports."""
