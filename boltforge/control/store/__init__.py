"""The store: engine and migrations, tables, the in-memory mirror, group commit."""
