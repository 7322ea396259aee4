"""Issue 17: what the stack makes of NCCL's transport after serving (inspection/nccl_transport)."""

from __future__ import annotations

from inspection.nccl_transport import parse_transport, verdict

NAMES = {"192.168.177.11": "spark-1", "192.168.177.12": "spark-2"}
IB = ("spark-1:10:11 [0] NCCL INFO NET/IB : Using [0]rocep1s0f1:1/RoCE [1]roceP2p1s0f1:1/RoCE "
      "[RO]; OOB enp1s0f1np1:192.168.177.11<0>\n"
      "spark-1:10:11 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0\n")
SOCKET_ON_2 = ("(RayWorkerWrapper pid=7, ip=192.168.177.12) spark-2:7:8 [0] NCCL INFO Channel "
               "00/0 : 1[0] -> 0[0] [send] via NET/Socket/0\n")


def test_roce_on_every_node_passes_and_names_the_nodes():
    v = verdict(parse_transport(IB, "192.168.177.11"), names=NAMES, rdma=True, strict=True,
                nccl_debug="INFO")
    assert v.problems == [] and v.warnings == []
    assert list(v.lines) == ["spark-1"] and v.lines["spark-1"].startswith("192.168.177.11: IB")


def test_a_socket_fallback_with_rdma_fails_outside_dev_and_warns_in_dev():
    report = parse_transport(IB + SOCKET_ON_2, "192.168.177.11")
    strict = verdict(report, names=NAMES, rdma=True, strict=True, nccl_debug="INFO")
    assert len(strict.problems) == 1 and strict.warnings == []
    assert strict.problems[0].startswith("spark-2: NCCL fell back to TCP sockets although "
                                         "nccl.rdma is true")
    dev = verdict(report, names=NAMES, rdma=True, strict=False, nccl_debug="INFO")
    assert dev.problems == [] and dev.warnings == strict.problems
    # without RDMA sockets are what was asked for
    plain = verdict(report, names=NAMES, rdma=False, strict=True, nccl_debug="INFO")
    assert plain.problems == [] and plain.warnings == []
    assert "TCP FALLBACK" in plain.lines["spark-2"]


def test_no_nccl_lines_is_unknown_and_fails_closed_with_rdma_outside_dev():
    quiet = verdict(parse_transport("", "192.168.177.11"), names=NAMES, rdma=True, strict=True,
                    nccl_debug="WARN")
    assert quiet.lines == {"all": "unknown: no NCCL transport lines (nccl.debug is WARN; INFO "
                                  "shows NCCL's choice)"}
    # issue 32: a transport the log cannot show is a failure in a stack that requires RDMA
    assert quiet.warnings == [] and len(quiet.problems) == 1
    assert "set spark-vllm:nccl.debug INFO" in quiet.problems[0]
    blind = verdict(parse_transport("", "192.168.177.11"), names=NAMES, rdma=True, strict=True,
                    nccl_debug="INFO")
    assert len(blind.problems) == 1 and "cannot be established" in blind.problems[0]
    lab = verdict(parse_transport("gloo only\n", "192.168.177.11"), names=NAMES, rdma=False,
                  strict=False, nccl_debug="INFO")
    assert lab.lines == {"all": "unknown: no NCCL transport lines (the log holds no NCCL line "
                                "that names a network, device or channel)"}
    assert lab.warnings == [] and lab.problems == []
