"""Issue 32: every parser on every recorded real output (tests/fixtures/{gb10,nccl,rdma}):
a result or a ParseError naming the command, never a traceback; ibstat and nvidia-smi's CSV
with its header line read on their recorded outputs."""

from __future__ import annotations

import inspect

import pytest

from inspection import image_probe, nccl_transport, parsers
from inspection.parsers import ParseError
from tests.unit.inspection.recon_helpers import fixture, fixtures, gb10

PARSERS = sorted(
    (name, fn) for name, fn in inspect.getmembers(parsers, inspect.isfunction)
    if name.startswith("parse_") and fn.__module__ == parsers.__name__
)
RECORDED = [*fixtures("gb10"), *fixtures("nccl"), *fixtures("rdma")]


def test_every_parser_is_in_the_sweep() -> None:
    assert "parse_ibstat" in dict(PARSERS) and len(PARSERS) >= 20


@pytest.mark.parametrize("name", RECORDED)
def test_every_parser_reads_or_refuses_every_recorded_output(name: str) -> None:
    text = fixture(name)
    for parser_name, parser in PARSERS:
        params = inspect.signature(parser).parameters
        args: list[object] = [text]
        if "kind" in params and params["kind"].default is inspect.Parameter.empty:
            args.append("recorded")
        try:
            parser(*args)
        except ParseError as exc:
            assert str(exc).startswith("cannot read the output of "), (parser_name, exc)
    nccl_transport.parse_transport(text, "192.168.177.11").summary()
    try:
        image_probe.parse_probe("spark-1", text)
    except image_probe.ImageProbeError as exc:
        assert str(exc).startswith("spark-1: the image probe printed no readable answer")


def test_ibstat_connectx7_active_ports_and_a_down_port() -> None:
    ports = parsers.parse_ibstat(fixture("rdma/ibstat-cx7-mt4129-two-active-one-down-mooncake.txt"))
    assert [(p.ca, p.ca_type, p.port, p.state, p.physical_state, p.rate_gbps, p.link_layer, p.up)
            for p in ports] == [
        ("mlx5_0", "MT4129", 1, "Active", "LinkUp", 200.0, "Ethernet", True),
        ("mlx5_1", "MT4129", 1, "Active", "LinkUp", 200.0, "Ethernet", True),
        # the capture is cut after `Physical state`: what it shows, nothing invented
        ("mlx5_10", "MT4125", 1, "Down", "Disabled", None, "", False),
    ]


@pytest.mark.parametrize(("text", "reason"), [
    ("        CA type: MT4129\n", "expected a `CA '<name>'` line first"),
    ("CA 'mlx5_0'\n        Port 1:\n                Rate: 200\n", "no 'State:' line"),
    ("CA 'mlx5_0'\n        Port 1:\n                State: Active\n                Rate: fast\n",
     "Rate 'fast' is not a number"),
    ("CA 'mlx5_0'\n        Port 1:\n                State: Active\n                State: Down\n",
     "State appears twice"),
    ("CA 'mlx5_0'\n        ibpanic!\n", "line is neither"),
])
def test_ibstat_refuses_what_it_cannot_read(text: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        parsers.parse_ibstat(text)


def test_ibstat_empty_is_no_device() -> None:
    assert parsers.parse_ibstat("") == []


def test_nvidia_smi_csv_with_its_header_line_is_read_by_its_names() -> None:
    """`--format=csv` (not noheader) on a DGX Spark: it was a ParseError about memory.total."""
    (gpu,) = parsers.parse_nvidia_smi_query(
        gb10("nvidia-smi-query-index-name-memory-csv-header-unsloth.txt"))
    assert (gpu.name, gpu.memory_total_mib, gpu.compute_capability) == ("NVIDIA GB10", None, "")
    # the recorded noheader form still reads as before
    (pgx,) = parsers.parse_nvidia_smi_query(
        gb10("nvidia-smi-query-name-cc-driver-memtotal-jethac-pgx.txt"))
    assert (pgx.compute_capability, pgx.driver_version) == ("12.1", "580.159.03")


@pytest.mark.parametrize(("text", "reason"), [
    ("index, memory.total [MiB]\n0, [N/A]\n", "the header line names no `name` column"),
    ("name, memory.total [MiB]\n", "a header line and no GPU row"),
])
def test_nvidia_smi_csv_header_refused_clearly(text: str, reason: str) -> None:
    with pytest.raises(ParseError, match=reason):
        parsers.parse_nvidia_smi_query(text)
