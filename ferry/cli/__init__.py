"""The ``ferry`` command line."""
