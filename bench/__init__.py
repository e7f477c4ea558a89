"""Benchmarks: one command each, results in bench/README.md."""
