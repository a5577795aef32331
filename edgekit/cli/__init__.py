"""The ``edgekit`` command line: a thin layer over the Python API, one module per command group."""
