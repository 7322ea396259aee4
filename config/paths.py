"""Folders on the machine that runs Pulumi (never on the nodes)."""

from __future__ import annotations

import os
from pathlib import Path


def local_state_dir() -> Path:
    """Per-user folder for files the SSH transport needs (known_hosts, key files):
    $SPARK_VLLM_HOME, by default ~/.cache/spark-vllm."""
    return Path(os.environ.get("SPARK_VLLM_HOME", os.path.expanduser("~/.cache/spark-vllm")))
