"""Config fuzzing: whatever a stack file holds, validation answers with a config or a named error.

Random and malformed values (wrong types, missing keys, unknown keys, out-of-range numbers,
weird strings, nested garbage) for every section, fed to `components.config.validate_config`.
The only acceptable outcomes are a valid `StackConfig`, or a `ConfigError` whose every problem
line starts with a `spark-vllm:` key path. Any other exception is a traceback an operator would
see instead of a fix, and fails the property.

Fixed budgets (no deadline, derandomized so CI runs the same cases every time); the number of
cases that ran is counted and printed at the end of the module (`-s` shows it) and written to
`.hypothesis/spark-vllm-fuzz-count.json` for docs/faults.md.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from config import NAMESPACE, ConfigError, StackConfig, validate_config
from tests.conftest import ROOT, config_raw

EXAMPLES = 300
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)

SECTIONS = ("environment", "nodes", "ssh", "image", "model", "nccl", "ray", "vllm", "preflight",
            "health", "gateway")
COUNTS: dict[str, int] = {}
OUTCOMES = {"valid": 0, "config_error": 0}

# ---------------------------------------------------------------------------- strategies

WEIRD_STRINGS = st.sampled_from([
    "", " ", "\n", "\x00", "\t\t", "null", "None", "true", "~", "-1", "1e309", "NaN", "0x1F",
    "ssh-ed25519", "ssh-ed25519 ", "ssh-ed25519 AAAA\nssh-rsa BBBB", "10.77.0.256", "::1",
    "fe80::1%eth0", "192.168.177.0/33", "../../etc/passwd", "/", "//", "a" * 300,
    "spark-1; rm -rf /", "$(reboot)", "`id`", "🦙", "é", "\u202e", "\ud7ff", "%s%s%n",
    "{{.Name}}", "[1, 2]", '{"a": 1}', "PLACEHOLDER", "registry:5000/x@sha256:" + "g" * 64,
    "0" * 40, "A" * 40, "http://", "https:// space", "ftp://x",
])

SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, 1, 65535, 65536, 2**31, 2**63, -(2**63), 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -0.0, 1.0, 0.8, 1e-300, 1e308]),
    st.text(max_size=40),
    WEIRD_STRINGS,
)

GARBAGE = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(st.text(max_size=12), WEIRD_STRINGS), inner, max_size=4),
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every key path (dict keys and list indexes) in a raw config, inner nodes included."""
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            out.append((*prefix, k))
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out.append((*prefix, i))
            out += _paths(v, (*prefix, i))
    return out


BASE = config_raw(2)
BASE_3 = config_raw(3)
ALL_PATHS = _paths(BASE)

def _get(raw: Any, path: tuple) -> Any:
    for p in path:
        raw = raw[p]
    return raw


DICT_PATHS = [()] + [p for p in ALL_PATHS if isinstance(_get(BASE, p), dict)]


def _replace(raw: dict, path: tuple, value: Any) -> dict:
    raw = copy.deepcopy(raw)
    target = _get(raw, path[:-1])
    target[path[-1]] = value
    return raw


def _delete(raw: dict, path: tuple) -> dict:
    raw = copy.deepcopy(raw)
    target = _get(raw, path[:-1])
    del target[path[-1]]
    return raw


# ---------------------------------------------------------------------------- the property


def check(raw: Any, name: str) -> None:
    COUNTS[name] = COUNTS.get(name, 0) + 1
    try:
        cfg = validate_config(raw)
    except ConfigError as exc:
        OUTCOMES["config_error"] += 1
        assert exc.problems, "a ConfigError with no problem lines"
        for problem in exc.problems:
            assert problem.startswith(f"{NAMESPACE}:"), f"problem without a key path: {problem!r}"
        assert f"{NAMESPACE}:" in str(exc)
        return
    # anything else propagates: hypothesis reports it with the shrunk input
    OUTCOMES["valid"] += 1
    assert isinstance(cfg, StackConfig)


# ---------------------------------------------------------------------------- properties


@FUZZ
@given(section=st.sampled_from(SECTIONS), value=GARBAGE)
def test_whole_section_replaced_by_garbage(section, value):
    check(_replace(BASE, (section,), value), "section_garbage")


@FUZZ
@given(path=st.sampled_from(ALL_PATHS), value=GARBAGE)
def test_any_key_replaced_by_garbage(path, value):
    """Every leaf and inner key of the dev config, one at a time, set to a random value."""
    check(_replace(BASE, path, value), "key_garbage")


@FUZZ
@given(paths=st.lists(st.sampled_from(ALL_PATHS), min_size=1, max_size=4, unique=True))
def test_keys_missing(paths):
    raw = BASE
    for path in sorted(paths, key=len, reverse=True):
        with contextlib.suppress(KeyError, IndexError, TypeError):  # a parent already went
            raw = _delete(raw, path)
    check(raw, "keys_missing")


@FUZZ
@given(
    where=st.sampled_from(DICT_PATHS),
    key=st.one_of(st.text(min_size=1, max_size=20), WEIRD_STRINGS,
                  st.sampled_from(["hostkey", "host_key", "tensor_parallel_size", "Port", "api_key",
                                   "hfToken", "extra", "nodes", "__class__", "model_config"])),
    value=GARBAGE,
)
def test_unknown_keys(where, key, value):
    raw = copy.deepcopy(BASE)
    target = _get(raw, where)
    if key in target:
        return  # not unknown
    target[key] = value
    check(raw, "unknown_keys")


NUMBERS = st.one_of(
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, -1, 1, 15, 16, 575, 576, 9978, 9979, 65535, 65536, 1023, 1024,
                     1048576, 1048577, 0.0, 1.0, 0.5, 1.5, -0.5, 9, 10, 7200, 7201, 600, 601]),
)
NUMERIC_PATHS = [p for p in ALL_PATHS
                 if isinstance(_get(BASE, p), (int, float)) and not isinstance(_get(BASE, p), bool)]
NUMERIC_PATHS += [("vllm", "pipelineParallelSize"), ("ray", "gpusPerNode"),
                  ("ssh", "connectTimeoutSeconds"), ("preflight", "reconTimeoutSeconds")]


@FUZZ
@given(path=st.sampled_from(sorted(set(NUMERIC_PATHS), key=str)), value=NUMBERS,
       three=st.booleans())
def test_numbers_out_of_range(path, value, three):
    base = BASE_3 if three else BASE
    raw = copy.deepcopy(base)
    parent = _get(raw, path[:-1]) if len(path) > 1 else raw
    if not isinstance(parent, dict):
        return
    parent[path[-1]] = value
    check(raw, "numbers")


@FUZZ
@given(raw=st.one_of(GARBAGE, st.dictionaries(st.sampled_from((*SECTIONS, "bogus")), GARBAGE,
                                              max_size=len(SECTIONS))))
def test_whole_config_garbage(raw):
    """Not even a mapping, or a mapping of random sections: a ConfigError, never a traceback."""
    check(raw, "whole_garbage")


@FUZZ
@given(node=st.fixed_dictionaries(
    {"name": st.one_of(WEIRD_STRINGS, st.text(max_size=20)),
     "host": st.one_of(WEIRD_STRINGS, st.ip_addresses().map(str), st.text(max_size=20)),
     "hostKey": st.one_of(WEIRD_STRINGS, st.text(max_size=60),
                          st.text(alphabet="ABCDEFabcdef0123456789+/=", min_size=1,
                                  max_size=80).map(lambda s: "ssh-ed25519 " + s)),
     "fabric": st.lists(st.fixed_dictionaries(
         {"interface": st.one_of(WEIRD_STRINGS, st.text(max_size=20)),
          "ip": st.one_of(st.ip_addresses(v=4).map(str), WEIRD_STRINGS),
          "hca": st.one_of(st.none(), WEIRD_STRINGS, st.text(max_size=16))}), max_size=3)},
    optional={"port": SCALARS, "user": st.one_of(WEIRD_STRINGS, st.text(max_size=34))},
))
def test_node_fields_weird_strings(node):
    raw = copy.deepcopy(BASE)
    raw["nodes"][1] = node
    check(raw, "node_strings")


def test_zz_report_case_count():
    """Runs last in this module: how many cases the properties above fed to validate_config."""
    total = sum(COUNTS.values())
    report = {"total": total, "per_property": COUNTS, "outcomes": OUTCOMES,
              "max_examples_per_property": EXAMPLES}
    print(f"\nconfig fuzz: {total} cases ran: {json.dumps(report)}")
    out = ROOT / ".hypothesis"
    out.mkdir(exist_ok=True)
    (out / "spark-vllm-fuzz-count.json").write_text(json.dumps(report, indent=2) + "\n")
    if COUNTS:  # the module ran as a whole
        assert total >= 6 * 100, report
