"""Benchmarks: each runs burstrl's side and the alternative in one `make bench` run and prints ratios
(docs/benchmarks.md)."""
