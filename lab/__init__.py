"""spark-vllm lab: simulated DGX Spark (GB10) hosts on one Linux machine (see lab/README.md).

Stdlib only: `python3 lab/lab.py <verb>` runs as root with the system python3, before any virtualenv
exists. Importing this package imports nothing: each module is imported where it is needed, and
only lab.deployments (for tests and bench) imports Pulumi, lazily, inside its functions.
"""
