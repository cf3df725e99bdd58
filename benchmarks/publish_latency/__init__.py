"""From a start's commit until a worker receives its run: ``python -m
benchmarks.publish_latency``."""
