"""The `autopar` command line: a thin layer over the library API."""
