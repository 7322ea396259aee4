"""Script builders keep values out of comment and echo lines unless the value is plain (issue 31,
item 7).

A value in a comment line is not protected by quoting (a newline ends the comment, and what
follows runs), and an unquoted value in an echo line is a shell word. Every input is validated
before it reaches a builder today, but a builder must not depend on that: each value it puts
into such a line goes through hostscripts.common.plain (letters, digits and ._:/@+=,- only) or
it raises ValueError, and the script is never made. With the values the stack really has, the
text is byte for byte what it was (the golden snapshots hold it).
"""

from __future__ import annotations

import pytest

from config import validate_config
from hostscripts import common, gateway, images, models, paths, vllm
from hostscripts.models import ModelFile
from inspection import recon
from tests.conftest import config_raw

HOSTILE = ["x\nrm -rf /", "x; reboot", "$(id)", "`id`", "a b", "it's", 'say "hi"', "", "x\r"]
NAMES = paths.StackNames("dev")
IMAGE = "sha256:" + "a" * 64
COMMIT = "c" * 40
FILES = [ModelFile("config.json", 3, "a" * 40)]



def _builders(value: str):
    """Every builder that puts a value into a comment or echo line, with `value` in that place."""
    return {
        "model_seeder_start commit": lambda: models.model_seeder_start(
            NAMES, IMAGE, "/c", "org/m", ["192.168.177.11"], {}, ["spark-2"], value),
        "model_seeder_start targets": lambda: models.model_seeder_start(
            NAMES, IMAGE, "/c", "org/m", ["192.168.177.11"], {}, [value], COMMIT),
        "model_seeder_start bind": lambda: models.model_seeder_start(
            NAMES, IMAGE, "/c", "org/m", [value], {}, ["spark-2"], COMMIT),
        "model_seeder_stop commit": lambda: models.model_seeder_stop(
            NAMES, ["spark-2"], value, IMAGE, ["192.168.177.11"]),
        "model_seeder_stop targets": lambda: models.model_seeder_stop(
            NAMES, [value], COMMIT, IMAGE, ["192.168.177.11"]),
        "model_seeder_stop bind": lambda: models.model_seeder_stop(
            NAMES, ["spark-2"], COMMIT, IMAGE, [value]),
        "image_seeder_start targets": lambda: images.image_seeder_start(
            NAMES, "reg:5000/x:tag", "192.168.177.11", [value]),
        "image_seeder_start bind": lambda: images.image_seeder_start(
            NAMES, "reg:5000/x:tag", value, ["spark-2"]),
        "image_seeder_stop targets": lambda: images.image_seeder_stop(
            NAMES, [value], "reg:5000/x:tag"),
        "image_seeder_stop ref": lambda: images.image_seeder_stop(NAMES, ["spark-2"], value),
        "drop_page_cache repo": lambda: models.drop_page_cache(value, COMMIT, FILES),
        "drop_page_cache commit": lambda: models.drop_page_cache("org/m", value, FILES),
        "vllm_ranks_restart": lambda: vllm.vllm_ranks_restart(value),
        # issue 30's gateway: haproxy.cfg's route comment and server lines (a newline there is
        # a directive of its own)
        "gateway render task": lambda: gateway.render(_gateway_spec(task=value)),
        "gateway render repo": lambda: gateway.render(_gateway_spec(repo=value)),
        "gateway render server node": lambda: gateway.render(_gateway_spec(node=value)),
        "gateway render server address": lambda: gateway.render(_gateway_spec(address=value)),
    }


def _gateway_spec(task="generate", repo="org/m", node="spark-1", address="127.0.0.1"):
    server = gateway.Server(node, address, 8000)
    return gateway.GatewaySpec(port=8080, tls=False, max_body_bytes=2 * 1024 * 1024,
                               routes=(gateway.Route("m", task, repo, (server,)),))


@pytest.mark.parametrize("where", sorted(_builders("x")))
@pytest.mark.parametrize("value", HOSTILE, ids=repr)
def test_a_value_that_is_not_plain_never_lands_in_a_comment_or_echo_line(where, value):
    with pytest.raises(ValueError, match="not a plain value"):
        _builders(value)[where]()


@pytest.mark.parametrize("value", [v for v in HOSTILE if v != "a b"], ids=repr)
def test_the_gateway_gates_marker_comment_holds_plain_words(value):
    """The gate's marker (container ID, configuration hash) is quoted in a comment line: its
    words may be separated by spaces, each must be plain."""
    with pytest.raises(ValueError, match="not a plain value"):
        gateway.gate_script(NAMES, "a" * 64 + " " + value, "http://127.0.0.1:8080",
                            _gateway_spec().routes, 60)
    assert "# gateway: 'aaaa" in gateway.gate_script(
        NAMES, "a" * 64 + " " + "b" * 16, "http://127.0.0.1:8080", _gateway_spec().routes, 60)


def test_plain_values_pass_unchanged():
    for v in ("spark-2", COMMIT, IMAGE, "192.168.177.11", "reg:5000/x@sha256:" + "b" * 64,
              "org/Qwen3.5-122B", "spark-vllm-dev-serve"):
        assert common.plain(v) == v


def test_the_recon_scripts_comment_holds_a_plain_node_name():
    cfg = validate_config(config_raw(2))
    node = cfg.nodes[0].model_copy(update={"name": "spark-1\nrm -rf /"})
    with pytest.raises(ValueError, match="not a plain value"):
        recon.recon_script(cfg, node, "5eed5eed5eed5eed", NAMES)
