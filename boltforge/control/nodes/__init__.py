"""Nodes and backends: leases, the state feed, launch, health and service."""
