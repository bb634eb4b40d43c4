"""Builders that make tests, benchmarks and examples read like the domain."""
