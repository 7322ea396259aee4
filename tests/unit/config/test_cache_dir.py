"""model.cacheDir: only a dedicated root, never a class of paths a list of names misses
(issue 31, item 2).

The folder is written as root by the model commands and bind-mounted into every container of
the stack: with cacheDir /var/lib/spark-vllm/stacks, stack a's containers read stack b's Ray
token and API key. It is an allow-list now (docs/design.md "The model cache folder"): the
default HF cache /root/.cache/huggingface and what is below it, a user's
~/.cache/huggingface, and a folder below /data or /srv; never the stack state folder
/var/lib/spark-vllm, anything in it or any folder above it.
"""

from __future__ import annotations

import pytest

from config import ConfigError, validate_config
from tests.conftest import config_raw

# Accepted before this change (the reproduction listed these and 18 more)
REFUSED = [
    "/usr", "/usr/local/bin", "/usr/local/lib/python3", "/var/spool/cron", "/var/spool/cron/crontabs",
    "/home/alice/.ssh", "/home/alice", "/home/alice/.config", "/var/lib/spark-vllm",
    "/var/lib/spark-vllm/stacks", "/var/lib/spark-vllm/stacks/dev", "/var/lib/spark-vllm/stopped",
    "/var/lib/spark-vllm/compile-cache", "/var/log", "/var/lib/apt", "/var/lib/systemd",
    "/var/cache", "/opt/nvidia", "/opt", "/tmp/hf", "/mnt/models", "/snap", "/media/usb",
    "/root/.cache", "/root/.config", "/root/.local/bin", "/root/hf",
    "/data", "/srv", "/run/spark-vllm/stacks", "/root/.cache/huggingfacex",
    "/home/alice/.cache/huggingface-evil", "/home/.cache/huggingface",
]
ACCEPTED = [
    "/root/.cache/huggingface", "/root/.cache/huggingface/hub-mirror", "/data/hf",
    "/data/models/huggingface", "/srv/hf", "/srv/spark-vllm/hf", "/home/alice/.cache/huggingface",
    "/home/bob/.cache/huggingface/x",
]


@pytest.mark.parametrize("folder", REFUSED)
def test_a_cache_folder_outside_the_dedicated_roots_is_refused(folder):
    with pytest.raises(ConfigError) as exc:
        validate_config(config_raw(2, model={"repo": "org/m", "cacheDir": folder}))
    (problem,) = exc.value.problems
    assert problem.startswith("spark-vllm:model.cacheDir: got "), problem
    assert "dedicated" in problem, problem


def _raw(folder: str, user: str | None = None) -> dict:
    raw = config_raw(2, model={"repo": "org/m", "cacheDir": folder})
    if user is not None:
        raw["nodes"] = [{**n, "user": user} for n in raw["nodes"]]
    return raw


@pytest.mark.parametrize("folder", ACCEPTED)
def test_a_cache_folder_under_a_dedicated_root_is_kept(folder):
    home = folder.split("/")[2] if folder.startswith("/home/") else None
    cfg = validate_config(_raw(folder, home))
    assert cfg.model.cache_dir == folder


@pytest.mark.parametrize("users", [("root", "root"), ("alice", "root"), ("bob", "bob")])
def test_a_home_cache_is_refused_unless_its_user_is_every_nodes_ssh_user(users):
    """The model commands write the cache as the ssh user (root on the Sparks); alice may plant
    links in her own home for them to follow (issue 46). The nodes check it again
    (payloads/cache_fs.py)."""
    raw = _raw("/home/alice/.cache/huggingface")
    raw["nodes"] = [{**n, "user": u} for n, u in zip(raw["nodes"], users, strict=True)]
    with pytest.raises(ConfigError) as exc:
        validate_config(raw)
    (problem,) = exc.value.problems
    assert problem.startswith("spark-vllm:model.cacheDir: got '/home/alice/.cache/huggingface'")
    assert "in the home of the nodes' ssh user only" in problem, problem
    assert validate_config(_raw("/home/alice/.cache/huggingface/x", "alice")).nodes[1].user == \
        "alice"


def test_the_stack_state_folder_and_its_parents_are_never_a_cache():
    """Whatever the allow-list becomes, /var/lib/spark-vllm, what is in it and every folder
    above it stay refused (their own check, not only absent from the list)."""
    from config import models

    for folder in ("/", "/var", "/var/lib", "/var/lib/spark-vllm", "/var/lib/spark-vllm/x/y",
                   "/run", "/run/spark-vllm", "/run/spark-vllm/stacks/a"):
        assert models.cache_dir_problem(folder) is not None, folder
    assert models.cache_dir_problem("/data/hf") is None
