"""Benchmarks of timewheel: scheduling precision, throughput and the HTTP client choice.

See bench/README.md. Nothing here is imported by the service or its tests.
"""
