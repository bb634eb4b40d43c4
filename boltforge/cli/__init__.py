"""The ``bolt`` command line."""
