"""inspection.nccl_transport on the recorded GB10 NCCL lines and on written logs: twins up or down,
IBext plugins, Socket fallback, mixed, Ray prefixes from 2-3 nodes, GDR, cut lines, noise."""

from __future__ import annotations

import random
import time

import pytest

from inspection.nccl_transport import (
    MAX_CHARS,
    Hca,
    SocketIf,
    parse_transport,
    socket_fallback,
)
from tests.unit.inspection.recon_helpers import gb10

HEAD, W1, W2 = "192.168.100.10", "192.168.100.11", "192.168.100.12"
P1 = "spark-1:1234:1290 [0] NCCL INFO "
P2 = "spark-2:5678:5700 [0] NCCL INFO "
RAY2 = f"\x1b[36m(RayWorkerWrapper pid=5678, ip={W1})\x1b[0m "
RAY3 = f"(pid=9012, ip={W2}) "
TWINS = "NET/IB : Using [0]rocep1s0f0:1/RoCE [1]roceP2p1s0f0:1/RoCE [RO]; OOB enp1s0f0np0:{ip}<0>"
ONE_TWIN = "NET/IB : Using [0]rocep1s0f0:1/RoCE ; OOB enp1s0f0np0:{ip}<0>"
ROCE_F0 = Hca(index=0, name="rocep1s0f0", port=1, link_layer="RoCE")
ROCE_P2 = Hca(index=1, name="roceP2p1s0f0", port=1, link_layer="RoCE")


def log(*lines: str) -> str:
    return "\n".join(lines) + "\n"


def test_recorded_oshlabs_fixture() -> None:
    report = parse_transport(gb10("nccl-debug-key-lines-oshlabs.txt"), default_node=HEAD)
    (node,) = report.nodes
    assert node.node == HEAD
    assert (node.transport, node.nets, node.net_plugin) == ("IB", ["IBext_v11"], "IBext_v11")
    assert node.hcas == [ROCE_F0, ROCE_P2]
    # no `GPU Direct RDMA ... for HCA` statement: unknown; the channels without /GDRDMA are detail
    assert (node.relaxed_ordering, node.oob, node.gdr, node.gdr_channels) == (True, None, "unknown",
                                                                              "off")
    assert (node.channels, node.ranks, node.hosts) == ({"NET/IBext_v11": 4}, [0], [])
    assert socket_fallback(report) == []
    assert report.summary() == (
        f"{HEAD}: IB (IBext_v11) hcas=rocep1s0f0:1/RoCE,roceP2p1s0f0:1/RoCE gdr=unknown "
        "channels=NET/IBext_v11:4 channel-gdrdma=off ranks=0"
    )
    assert (report.lines_scanned, report.truncated, report.repeated_lines) == (5, False, 0)


def test_both_twins_up_with_full_prefix() -> None:
    text = log(
        P1 + TWINS.format(ip=HEAD),
        P1 + "Using network IB",
        P1 + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
        P1 + "Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1",
        P1 + "Channel 00/0 : 1[0] -> 0[0] [receive] via NET/IB/0",
    )
    (node,) = parse_transport(text, HEAD).nodes
    assert (node.transport, node.nets, node.net_plugin) == ("IB", ["IB"], None)
    assert node.hcas == [ROCE_F0, ROCE_P2]
    assert node.oob == f"enp1s0f0np0:{HEAD}<0>"
    assert (node.channels, node.ranks, node.hosts) == ({"NET/IB": 2}, [0], ["spark-1"])


def test_one_twin_down_lists_one_hca() -> None:
    (node,) = parse_transport(log(P1 + ONE_TWIN.format(ip=HEAD)), HEAD).nodes
    assert node.hcas == [ROCE_F0]
    assert (node.transport, node.relaxed_ordering, node.gdr) == ("IB", False, "unknown")
    assert "hcas=rocep1s0f0:1/RoCE gdr" in node.line()


def test_rail_and_plane_suffixes_and_infiniband_link_layer() -> None:
    text = log(P1 + "NET/IB : Using [0]mlx5_0:1:3/IB [1]mlx5_1:1::2/IB [2]mlx5_2:1:0:1/IB ; OOB ib0:10.0.0.1<0>")
    (node,) = parse_transport(text, HEAD).nodes
    assert [(h.name, h.port, h.link_layer) for h in node.hcas] == [
        ("mlx5_0", 1, "IB"),
        ("mlx5_1", 1, "IB"),
        ("mlx5_2", 1, "IB"),
    ]


@pytest.mark.parametrize("plugin", ["IBext_v8", "IBext_v9", "IBext_v10", "IBext_v11"])
def test_ibext_plugin_names(plugin: str) -> None:
    text = log(
        P1 + "P2P plugin v11 " + plugin,
        P1 + TWINS.format(ip=HEAD),
        P1 + f"Using network {plugin}",
        P1 + f"Channel 00/0 : 0[0] -> 1[0] [send] via NET/{plugin}/0/GDRDMA",
        P1 + f"Channel 01/0 : 0[0] -> 1[0] [send] via NET/{plugin}/1/GDRDMA",
    )
    (node,) = parse_transport(text, HEAD).nodes
    assert (node.transport, node.nets, node.net_plugin) == ("IB", [plugin], plugin)
    assert (node.gdr, node.gdr_channels) == ("unknown", "on")  # no statement per HCA
    assert node.channels == {f"NET/{plugin}": 2}


def test_socket_fallback_with_interface() -> None:
    text = log(
        P2 + f"NET/Socket : Using [0]enp1s0f0np0:{W1}<0> [1]enP7s7:10.0.0.11<0>",
        P2 + "Using network Socket",
        P2 + "Channel 00/0 : 0[0] -> 1[0] [receive] via NET/Socket/0",
        P2 + "Channel 01/0 : 0[0] -> 1[0] [receive] via NET/Socket/1",
        P2 + "ncclCommInitRank comm 0xaaab1c0 rank 1 nranks 2 cudaDev 0 nvmlDev 0 busId f01000 commId 0x9f - Init COMPLETE",
    )
    report = parse_transport(text, W1)
    (node,) = report.nodes
    assert (node.transport, node.nets, node.net_plugin, node.hcas) == ("Socket", ["Socket"], None, [])
    assert node.socket_ifs == [
        SocketIf(index=0, name="enp1s0f0np0", address=W1),
        SocketIf(index=1, name="enP7s7", address="10.0.0.11"),
    ]
    assert (node.gdr, node.channels, node.ranks) == ("unknown", {"NET/Socket": 2}, [1])
    assert socket_fallback(report) == [W1]
    assert report.summary() == (
        f"{W1}: Socket TCP FALLBACK ifs=enp1s0f0np0:{W1},enP7s7:10.0.0.11 gdr=unknown "
        "channels=NET/Socket:2 channel-gdrdma=off ranks=1"
    )


def test_ipv6_socket_address() -> None:
    text = log(P1 + "NET/Socket : Using [0]eth0:fe80::1%eth0<0>")
    (node,) = parse_transport(text, HEAD).nodes
    assert node.socket_ifs == [SocketIf(index=0, name="eth0", address="fe80::1%eth0")]
    assert node.transport == "Socket"  # only the init line: no channel yet


def test_mixed_ib_and_socket_on_one_node() -> None:
    text = log(
        P1 + TWINS.format(ip=HEAD),
        P1 + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
        P1 + "Channel 01/0 : 0[0] -> 1[0] [send] via NET/Socket/0",
    )
    report = parse_transport(text, HEAD)
    (node,) = report.nodes
    assert (node.transport, node.nets) == ("mixed", ["IB", "Socket"])
    assert node.channels == {"NET/IB": 1, "NET/Socket": 1}
    assert socket_fallback(report) == [HEAD]
    assert node.line().startswith(f"{HEAD}: mixed TCP FALLBACK hcas=")


def test_ray_prefixed_two_nodes_with_repeated() -> None:
    text = log(
        "INFO 06-07 10:00:00 [ray_utils.py:1] Connecting to existing Ray cluster",
        P1 + TWINS.format(ip=HEAD),
        RAY2 + P2 + ONE_TWIN.format(ip=W1) + " [repeated 2x across cluster]",
        P1 + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v11/0",
        RAY2 + P2 + "Channel 00/0 : 0[0] -> 1[0] [receive] via NET/IBext_v11/0 [repeated 3x across cluster] "
        "(Ray deduplicates logs by default. Set RAY_DEDUP_LOGS=0 to disable log deduplication)",
    )
    report = parse_transport(text, HEAD)
    assert [n.node for n in report.nodes] == [HEAD, W1]
    head, worker = report.nodes
    assert (head.hcas, head.ranks, head.hosts) == ([ROCE_F0, ROCE_P2], [0], ["spark-1"])
    assert (worker.hcas, worker.ranks, worker.hosts) == ([ROCE_F0], [1], ["spark-2"])
    assert worker.oob == f"enp1s0f0np0:{W1}<0>"
    assert (worker.transport, worker.net_plugin) == ("IB", "IBext_v11")
    assert report.repeated_lines == 5
    assert report.summary().splitlines()[-1] == "(Ray folded 5 lines; RAY_DEDUP_LOGS=0 shows all)"


def test_ray_prefixed_three_nodes_one_on_socket() -> None:
    text = log(
        P1 + "Channel 00/0 : 2[0] -> 0[0] [receive] via NET/IB/0",
        f"(EngineCore_DP0 pid=96) (RayWorkerWrapper pid=5678, ip={W1}) "
        + P2 + "Channel 00/0 : 1[0] -> 2[0] [send] via NET/IB/0",
        RAY3 + "spark-3:77:88 [0] NCCL INFO Using network Socket [repeated 2x across cluster]",
        RAY3 + "spark-3:77:88 [0] NCCL INFO Channel 00/0 : 2[0] -> 0[0] [send] via NET/Socket/0",
        "(RayWorkerWrapper pid=1070) " + P1 + "Using network IB",
    )
    report = parse_transport(text, HEAD)
    assert [(n.node, n.transport, n.ranks) for n in report.nodes] == [
        (HEAD, "IB", [0]),
        (W1, "IB", [1]),
        (W2, "Socket", [2]),
    ]
    assert report.node(W2) is not None and report.node(W2).hosts == ["spark-3"]  # type: ignore[union-attr]
    assert socket_fallback(report) == [W2]
    assert report.repeated_lines == 2


@pytest.mark.parametrize(
    ("lines", "gdr"),
    [
        (["NET/IB : GPU Direct RDMA Disabled for HCA 0 'rocep1s0f0'"], "off"),
        (["NET/IBext_v11 : GPU Direct RDMA Enabled for HCA 0 'rocep1s0f0'"], "on"),
        (["NET/IB : GPU Direct RDMA (DMABUF) enabled for HCA 0 'rocep1s0f0"], "on"),
        (["GPU Direct RDMA Disabled for GPU 0 / HCA 0 (distance 5 > 4)"], "off"),
        (
            [
                "NET/IB : GPU Direct RDMA Enabled for HCA 0 'rocep1s0f0'",
                "NET/IB : GPU Direct RDMA Disabled for HCA 1 'roceP2p1s0f0'",
            ],
            "mixed",
        ),
        (  # NCCL's statement per HCA is the truth; a channel without /GDRDMA is detail
            [
                "NET/IB : GPU Direct RDMA Enabled for HCA 0 'rocep1s0f0'",
                "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0",
            ],
            "on",
        ),
        (  # channels alone are no statement
            [
                "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA(PCI)/Shared",
                "Channel 01/0 : 0[0] -> 1[0] [send] via NET/IB/1(1)/GDRDMA",
            ],
            "unknown",
        ),
        (  # the same HCA stated twice (two comms): its last word
            [
                "NET/IB : GPU Direct RDMA Disabled for HCA 0 'rocep1s0f0'",
                "NET/IB : GPU Direct RDMA Enabled for HCA 0 'rocep1s0f0'",
            ],
            "on",
        ),
    ],
)
def test_gpu_direct_rdma(lines: list[str], gdr: str) -> None:
    (node,) = parse_transport(log(*(P1 + line for line in lines)), HEAD).nodes
    assert node.gdr == gdr


def test_intra_node_channels_are_counted_but_say_nothing_of_the_net() -> None:
    text = log(P1 + "Channel 00/0 : 0[0] -> 1[0] via P2P/IPC", P1 + "Channel 01 : 0[f01000] -> 1[f01000] via SHM/direct/direct")
    (node,) = parse_transport(text, HEAD).nodes
    assert (node.transport, node.channels, node.ranks, node.gdr) == ("unknown", {"P2P": 1, "SHM": 1}, [], "unknown")


def test_lines_cut_mid_way() -> None:
    full = P1 + TWINS.format(ip=HEAD)
    for cut in range(len(P1), len(full)):  # a cut HCA list is dropped, never shown as "twin down"
        report = parse_transport(full[:cut], HEAD)
        assert [n.hcas for n in report.nodes] in ([], [[ROCE_F0, ROCE_P2]]), full[:cut]
    assert parse_transport(full[: full.index(" [RO]")], HEAD).nodes == []
    cut_channel = log(P1 + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IBext_v1")
    assert parse_transport(cut_channel, HEAD).nodes == []
    assert parse_transport(P1 + "Using network IBe", HEAD).nodes == []  # last line, no newline
    (node,) = parse_transport(P1 + "Using network IBext_v11\n", HEAD).nodes
    assert node.net_plugin == "IBext_v11"
    cut_socket = P1 + f"NET/Socket : Using [0]enp1s0f0np0:{HEAD}<0> [1]enP7s7:10.0"
    (node,) = parse_transport(cut_socket, HEAD).nodes
    assert node.socket_ifs == [SocketIf(index=0, name="enp1s0f0np0", address=HEAD)]


def test_ansi_codes_and_carriage_returns() -> None:
    text = (
        f"\x1b[0;36m(RayWorkerWrapper pid=5678, ip={W1})\x1b[0;0m \x1b[1m{P2}\x1b[0m"
        "NET/IB : Using [0]rocep1s0f0:1/RoCE \x1b[32m[1]roceP2p1s0f0:1/RoCE\x1b[0m [RO]; OOB x:1.2.3.4<0>\r\n"
        "Loading weights:  50%\r" + P1 + "Using network IBext_v11\r\n"
    )
    report = parse_transport(text, HEAD)
    assert [(n.node, n.hcas, n.nets) for n in report.nodes] == [
        (W1, [ROCE_F0, ROCE_P2], []),
        (HEAD, [], ["IBext_v11"]),
    ]
    assert report.node(W1).transport == "IB"  # type: ignore[union-attr]


def test_empty_input() -> None:
    report = parse_transport("", HEAD)
    assert (report.nodes, report.lines_scanned, report.truncated) == ([], 0, False)
    assert report.summary() == "nccl: no NCCL transport lines found (is NCCL_DEBUG=INFO set?)"
    assert socket_fallback(report) == []
    assert report.node(HEAD) is None


def test_garbage_binary_and_malformed_prefixes() -> None:
    rng = random.Random(1234)
    noise = bytes(rng.randrange(256) for _ in range(20000)).decode("latin-1")
    text = log(
        noise,
        "NET/IB : Using [[[[0]",
        "NET/IB : Using [0]rocep1s0f0:x/RoCE ; OOB",
        "Channel 00/0 : -> via NET/",
        f"(RayWorkerWrapper pid=5678, ip={W1} " + P2 + "Using network Socket",  # prefix never closed
        "(RayWorkerWrapper pid=5678, ip=bad ip) " + P2 + "Using network Socket",
        "\x00\x1b[" + "NET/" * 5000,
        "GPU Direct RDMA maybe for HCA 0",
        noise[::-1],
    )
    report = parse_transport(text, HEAD)
    assert report.nodes == []
    assert report.summary().startswith("nccl: no NCCL transport lines found")


def test_noise_never_raises() -> None:
    rng = random.Random(42)
    pieces = ["NET/IB : Using ", "[0]", "rocep1s0f0", ":1", "/RoCE", " [RO]", ";", " via ", "NET/Socket/0",
              "Channel 00/0 : ", "0[0] -> 1[0]", "(pid=1, ip=", ")", "\x1b[3", "\r", "\n", "Using network ",
              "GPU Direct RDMA Enabled for HCA", " [repeated 2x across cluster]", "\x00", "é", " "]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randrange(60)))
        report = parse_transport(text, HEAD)
        assert all(n.transport in ("IB", "Socket", "mixed", "unknown") for n in report.nodes)
        assert isinstance(report.summary(), str)


def test_only_the_tail_of_a_huge_log_is_read() -> None:
    early = P1 + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/Socket/0\n"
    late = P1 + "Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n"
    filler = "INFO 06-07 10:00:00 [engine.py:1] a routine line that mentions nothing of interest\n"
    text = early + filler * (MAX_CHARS // len(filler) + 10) + late * 20000
    started = time.perf_counter()
    report = parse_transport(text, HEAD)
    assert time.perf_counter() - started < 10
    (node,) = report.nodes
    assert (report.truncated, node.transport, node.channels) == (True, "IB", {"NET/IB": 1})
    assert 20000 < report.lines_scanned < text.count("\n") - 10


def test_pathological_lines_stay_linear() -> None:
    lines = [
        " " * 16000 + "x",
        "w" * 300 + " NCCL INFO Using network IB",
        "NET/IB : Using " + "[0]a:1/RoCE " * 1300,
        "NET/Socket : Using " + "[0]e:" + "1" * 16000,
        "(" * 16000 + "pid=",
        "GPU Direct RDMA (" + "x" * 16000,
    ]
    text = "\n".join(lines * 40) + "\n"
    started = time.perf_counter()
    report = parse_transport(text, HEAD)
    assert time.perf_counter() - started < 5
    (node,) = report.nodes  # the `w...w NCCL INFO` lines: no hostname, still a message
    assert (node.nets, node.hosts, node.hcas) == (["IB"], [], [])
