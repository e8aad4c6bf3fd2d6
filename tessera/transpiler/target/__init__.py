"""Backends: each prints the Tile IR as target source, plus the metadata runtimes read."""
