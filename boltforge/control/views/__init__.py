"""Reads for people: API replies, console views, metrics and cost reports."""
