"""The node script of `spark-vllm logs` (hostscripts/logs.py): the --since values it passes to
Docker, and what it quotes or refuses. tests/unit/tools/test_logs.py runs it for real with bash
against a fake `docker`."""

from __future__ import annotations

import pytest

from hostscripts import logs
from hostscripts.paths import StackNames

SERVE = StackNames("dev").serve


@pytest.mark.parametrize("value", ["10m", "1h30m", "90s", "1.5h", "2024-05-01", "2024-05-01T12:00",
                                   "2024-05-01T12:00:00Z", "2024-05-01T12:00:00.123456789+02:00",
                                   "2024-05-01Z", "1714564800", "1714564800.5"])
def test_since_accepts_what_docker_accepts(value):
    assert logs.check_since(value) == value


@pytest.mark.parametrize("value", ["", "10x", "yesterday", "10m; rm -rf /", "$(id)", "-1h",
                                   "2024-13-01", "2024-05-01T25:00", "2024-05-01 12:00", "10 m"])
def test_since_refuses_anything_else(value):
    with pytest.raises(ValueError, match="not a time Docker accepts"):
        logs.check_since(value)

def test_node_script_quotes_what_it_is_given_and_refuses_bad_names():
    script = logs.node_script([SERVE], logs.Options(since="2024-05-01T12:00:00Z", tail=5))
    assert "since=2024-05-01T12:00:00Z\n" in script and "tail=5\n" in script
    with pytest.raises(ValueError, match="not a container name"):
        logs.node_script(["x; reboot"], logs.Options())
    with pytest.raises(ValueError, match="not a time Docker accepts"):
        logs.node_script([SERVE], logs.Options(since="$(reboot)"))
