"""inspection/day_zero.py (`spark-vllm init`'s proposal), fed with recorded real surveys.

Recorded outputs (tests/fixtures/init, the lab's simulated Sparks answering recon's own script
made with nonce 5eed5eed5eed5eed, speed_of=()):
- lab-spark-1-fresh.txt, lab-spark-2-fresh.txt: the fabric configured as the dev stack has it;
- lab-spark-2-nocarrier.txt: spark-2 with its fabric cable cut;
- lab-spark-1-seeded.txt: spark-1 holding foreign vLLM containers, a vllm-node:latest image and
  a partial Hugging Face cache of spark-lab/tiny-moe.
Real GB10 ibdev2netdev outputs (tests/fixtures/gb10, INDEX.md) check the twin order on names of
other units. Variants are the parsed facts with one thing changed (model_copy), each test says
which recorded output it starts from and what it changes.

Proved: the fresh pair proposes exactly Pulumi.dev.yaml's nodes (plus the pinned keys), its
subnets and GPU count; addresses are kept, or proposed free in the twin's subnet with a warning;
--subnet wins; everything init cannot see without guessing (no carrier, no RoCE device, uneven
cabling, no GPU, twins in different or overlapping subnets, too many --subnet, a name twice) is
an error and no node is proposed; low MTU and non-DGX hosts are warnings; what the hosts hold
(foreign containers, vLLM images, the model's cache) is reported; node_name() and fingerprint().
"""

from __future__ import annotations

import ipaddress

import yaml

from config import NodeConfig
from inspection import day_zero, parsers, recon
from inspection.facts import GpuFacts, InterfaceFacts, NodeFacts, RoceFacts
from tests.conftest import ROOT
from tests.unit.inspection.recon_helpers import gb10

INIT = ROOT / "tests" / "fixtures" / "init"
NONCE = "5eed5eed5eed5eed"
# the lab nodes' ed25519 host keys and their fingerprints as `ssh-keygen -lf` prints them
KEY_1 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPykkYzPvHrVjEDRoWCY0vynXHUvfbCJFpaFuAhGr90L"
KEY_2 = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAzciBTDgFfru/NcREI8UuDkm3ihu7lliKeTKf+k8ZJL"
FP_1 = "SHA256:9+sb7PHUVMRwBjmPfNEfCzeu+S3Xi1GQQ/t19YxEkcA"
FP_2 = "SHA256:iFjp5G0dhMxbLS30xg4SjVFXmxKKkkknentZ65fFM+U"
KEYS = {1: KEY_1, 2: KEY_2}

T1, T2 = "enp1s0f1np1", "enP2p1s0f1np1"  # the lab's twins, as its ibdev2netdev lists them


def facts(fixture: str, node: str) -> NodeFacts:
    """A recorded survey (tests/fixtures/init/<fixture>.txt), parsed as recon parses it."""
    return recon.parse_recon_output(node, (INIT / f"{fixture}.txt").read_text(), nonce=NONCE)


def fresh(n: int) -> NodeFacts:
    return facts(f"lab-spark-{n}-fresh", f"spark-{n}")


def survey(f: NodeFacts, n: int, name: str | None = None) -> day_zero.Survey:
    return day_zero.Survey(name=name or f"spark-{n}", host=f"10.77.0.1{n}", user="root", port=22,
                           host_key=KEYS.get(n, KEY_1), facts=f)


def with_iface(f: NodeFacts, name: str, **changes) -> NodeFacts:
    """`f` with interface `name` changed (ipv4, mtu, carrier...)."""
    assert any(i.name == name for i in f.interfaces), name
    return f.model_copy(update={"interfaces": [i.model_copy(update=changes) if i.name == name
                                               else i for i in f.interfaces]})


def pair(f1: NodeFacts | None = None, f2: NodeFacts | None = None) -> list[day_zero.Survey]:
    return [survey(f1 or fresh(1), 1), survey(f2 or fresh(2), 2)]


def levels(p: day_zero.Proposal, level: str) -> list[str]:
    return [str(f) for f in p.findings if f.level == level]


def ports(p: day_zero.Proposal, node: str) -> list[tuple[str, str, bool]]:
    return [(x.interface, x.ip, x.configured) for x in p.ports[node]]



def propose(*args, **kwargs):
    """day_zero.propose for a stack whose fabric is configured by hand (fabric.manage false):
    a port without its address or MTU is a warning; the managed case (notes) has its own test."""
    return day_zero.propose(*args, managed=False, **kwargs)


def test_with_the_fabric_managed_a_fresh_port_is_a_note_not_a_warning():
    """lab-spark-2-fresh with its second twin unconfigured (no address, MTU 1500), as the lab
    leaves a port for the stack: proposed, and `pulumi up` will configure it."""
    f2 = with_iface(fresh(2), T2, ipv4=[], mtu=1500)
    p = day_zero.propose(pair(f2=f2))
    assert levels(p, "warning") == [] and p.errors == []
    notes = [str(f) for f in p.findings if f.level == "note"]
    assert f"spark-2: {T2} has no address: proposed 192.168.178.12/24; `pulumi up` configures " \
           "it (fabric.manage)" in notes, notes
    assert f"spark-2: {T2} has MTU 1500: `pulumi up` sets fabric.mtu (fabric.manage)" in notes

# --------------------------------------------------------------------------- the fresh pair

def test_fresh_pair_proposes_exactly_the_dev_stacks_nodes():
    """lab-spark-{1,2}-fresh as recorded: the nodes of Pulumi.dev.yaml, in order, keys pinned."""
    dev = yaml.safe_load((ROOT / "Pulumi.dev.yaml").read_text())["config"]
    expected = [{**node, "hostKey": KEYS[i + 1]}
                for i, node in enumerate(dev["spark-vllm:nodes"])]
    p = propose(pair())
    assert p.nodes == expected
    assert [n["name"] for n in p.nodes] == ["spark-1", "spark-2"]  # the head first
    assert p.subnets == ["192.168.177.0/24", "192.168.178.0/24"] \
        == dev["spark-vllm:nccl"]["fabricSubnets"]
    assert p.gpus == 2 == dev["spark-vllm:vllm"]["tensorParallelSize"]
    assert levels(p, "error") == [] and levels(p, "warning") == []
    assert all(port.configured and port.mtu == 9000 for ps in p.ports.values() for port in ps)


def test_fingerprint_is_the_one_ssh_keygen_prints():
    assert day_zero.fingerprint(KEY_1) == FP_1
    assert day_zero.fingerprint(KEY_2) == FP_2
    # a known_hosts-style line with a comment after the key: only the key counts
    assert day_zero.fingerprint(KEY_2 + " root@spark-2") == FP_2


# --------------------------------------------------------------------------- addresses

def test_an_interface_without_address_gets_a_free_one_in_its_twins_subnet():
    """lab-spark-2-fresh with no address on enP2p1s0f1np1: spark-1's twin keeps 192.168.178.11,
    spark-2's gets 192.168.178.12 (its .1x slot), unconfigured, with a warning that names it."""
    p = propose(pair(f2=with_iface(fresh(2), T2, ipv4=[])))
    assert p.errors == []
    assert p.subnets == ["192.168.177.0/24", "192.168.178.0/24"]
    assert ports(p, "spark-1") == [(T1, "192.168.177.11", True), (T2, "192.168.178.11", True)]
    assert ports(p, "spark-2") == [(T1, "192.168.177.12", True), (T2, "192.168.178.12", False)]
    (warning,) = [f for f in p.findings if f.level == "warning"]
    assert warning.node == "spark-2"
    assert f"{T2} has no address: proposed 192.168.178.12/24" in warning.text
    assert p.nodes[1]["fabric"][1] == {"interface": T2, "ip": "192.168.178.12",
                                       "hca": "roceP2p1s0f1"}


def test_a_proposed_address_is_never_one_another_node_holds():
    """lab-spark-1-fresh also holding 192.168.178.12/24 (a second address on its twin 2) and
    lab-spark-2-fresh without an address on twin 2: spark-2 is given .13, not the taken .12."""
    f1 = with_iface(fresh(1), T2, ipv4=["192.168.178.11/24", "192.168.178.12/24"])
    p = propose(pair(f1, with_iface(fresh(2), T2, ipv4=[])))
    assert p.errors == []
    assert ports(p, "spark-1")[1] == (T2, "192.168.178.11", True)
    assert ports(p, "spark-2")[1] == (T2, "192.168.178.13", False)
    assert any("proposed 192.168.178.13/24" in w for w in levels(p, "warning"))


def test_twins_without_any_address_get_the_default_subnet():
    """Both fresh outputs with no address on twin 1: the default 192.168.177.0/24, .11 and .12,
    one warning per node."""
    p = propose(pair(with_iface(fresh(1), T1, ipv4=[]), with_iface(fresh(2), T1, ipv4=[])))
    assert p.subnets == ["192.168.177.0/24", "192.168.178.0/24"]
    assert [ports(p, n)[0] for n in ("spark-1", "spark-2")] == [
        (T1, "192.168.177.11", False), (T1, "192.168.177.12", False)]
    assert sorted(f.node for f in p.findings if f.level == "warning") == ["spark-1", "spark-2"]


def test_an_existing_subnet_is_kept_even_when_not_the_default():
    """Both fresh outputs with twin 1 moved to 10.10.1.11/24 and 10.10.1.12/24 (spark-2's then
    removed): 10.10.1.0/24 is twin 1's subnet and spark-2 is proposed 10.10.1.12 in it."""
    f1 = with_iface(fresh(1), T1, ipv4=["10.10.1.11/24"])
    p = propose(pair(f1, with_iface(fresh(2), T1, ipv4=["10.10.1.12/24"])))
    assert p.subnets == ["10.10.1.0/24", "192.168.178.0/24"]
    assert levels(p, "warning") == [] and p.errors == []
    assert ports(p, "spark-2")[0] == (T1, "10.10.1.12", True)

    p = propose(pair(f1, with_iface(fresh(2), T1, ipv4=[])))
    assert p.subnets == ["10.10.1.0/24", "192.168.178.0/24"]
    assert ports(p, "spark-2")[0] == (T1, "10.10.1.12", False)


def test_subnet_override_wins_over_the_nodes_addresses():
    """The fresh pair with subnets=("10.20.0.0/24", "10.21.0.0/24"): those subnets, the addresses
    .11/.12 proposed in them, and a warning naming the address each interface has now."""
    p = propose(pair(), subnets=["10.20.0.0/24", "10.21.0.0/24"])
    assert p.errors == []
    assert p.subnets == ["10.20.0.0/24", "10.21.0.0/24"]
    assert ports(p, "spark-1") == [(T1, "10.20.0.11", False), (T2, "10.21.0.11", False)]
    assert ports(p, "spark-2") == [(T1, "10.20.0.12", False), (T2, "10.21.0.12", False)]
    warnings = levels(p, "warning")
    assert len(warnings) == 4
    assert any(f"spark-2: {T1} has no address in 10.20.0.0/24 (it has 192.168.177.12/24): "
               "proposed 10.20.0.12/24" in w for w in warnings), warnings


def test_one_subnet_override_applies_to_twin_1_only():
    """The fresh pair with subnets=("192.168.177.0/24",): twin 2 keeps its own subnet."""
    p = propose(pair(), subnets=["192.168.177.0/24"])
    assert p.subnets == ["192.168.177.0/24", "192.168.178.0/24"]
    assert p.findings == []


def test_more_subnets_than_cabled_twins_is_an_error():
    p = propose(pair(), subnets=["10.20.0.0/24", "10.21.0.0/24", "10.22.0.0/24"])
    assert [str(f) for f in p.errors] == ["--subnet given 3 times for 2 cabled twin(s)"]
    assert p.nodes == [] and p.subnets == []


def test_twin_addresses_in_different_subnets_are_an_error_naming_both():
    """lab-spark-2-fresh with twin 1 at 10.10.1.12/24 while spark-1's is 192.168.177.11/24."""
    p = propose(pair(f2=with_iface(fresh(2), T1, ipv4=["10.10.1.12/24"])))
    (error,) = p.errors
    assert f"spark-1 {T1} 192.168.177.11/24" in error.text
    assert f"spark-2 {T1} 10.10.1.12/24" in error.text
    assert "twin-1" in error.text and "--subnet" in error.text
    assert p.nodes == [] and p.subnets == []


def test_overlapping_twin_subnets_are_an_error():
    """Both fresh outputs with twin 2 moved into twin 1's subnet (192.168.177.21/24, .22/24);
    and, on the fresh pair as recorded, --subnet values that overlap."""
    f1 = with_iface(fresh(1), T2, ipv4=["192.168.177.21/24"])
    p = propose(pair(f1, with_iface(fresh(2), T2, ipv4=["192.168.177.22/24"])))
    assert [f.text for f in p.errors] == [
        "twin subnets 192.168.177.0/24 and 192.168.177.0/24 overlap"]
    assert p.nodes == []

    p = propose(pair(), subnets=["192.168.0.0/16", "192.168.178.0/24"])
    assert [f.text for f in p.errors] == ["twin subnets 192.168.0.0/16 and 192.168.178.0/24 overlap"]
    assert p.nodes == []


def test_a_link_local_address_is_not_taken_for_a_configured_fabric():
    """Both fresh outputs with twin 1 holding only an IPv4 link-local address, as a real GB10
    with an unconfigured fabric shows it (ip-br-addr-code-monkeys-hutch.txt: enp1s0f1np1
    169.254.127.30/16, its twin without IPv4), and twin 2 without an address. A 169.254/16
    address is the kernel's/NetworkManager's self-assigned one (RFC 3927), not the fabric the
    playbook configures: it must not become nccl.fabricSubnets nor a port proposed as already
    configured without a word; a finding must name it."""
    f1 = with_iface(with_iface(fresh(1), T1, ipv4=["169.254.127.30/16"]), T2, ipv4=[])
    f2 = with_iface(with_iface(fresh(2), T1, ipv4=["169.254.9.4/16"]), T2, ipv4=[])
    p = propose(pair(f1, f2))
    assert "169.254.0.0/16" not in p.subnets, p.subnets
    assert not any(port.configured and ipaddress.ip_address(port.ip).is_link_local
                   for ps in p.ports.values() for port in ps), p.ports
    assert any("169.254.127.30" in f.text for f in p.findings), [str(f) for f in p.findings]


# --------------------------------------------------------------------------- what init refuses

def test_no_carrier_is_an_error_that_names_the_ports_and_does_not_guess():
    """lab-spark-1-fresh + lab-spark-2-nocarrier as recorded."""
    p = propose(pair(f2=facts("lab-spark-2-nocarrier", "spark-2")))
    (error,) = p.errors
    assert error.node == "spark-2"
    assert "rocep1s0f1 ==> enp1s0f1np1 (no carrier)" in error.text
    assert "roceP2p1s0f1 ==> enP2p1s0f1np1 (no carrier)" in error.text
    assert "does not guess" in error.text
    assert p.nodes == [] and p.subnets == [] and p.ports == {}


def test_no_roce_device_at_all_is_an_error():
    """lab-spark-2-fresh with its RoCE list empty; then also with both tools missing."""
    f2 = fresh(2).model_copy(update={"roce": []})
    (error,) = propose(pair(f2=f2)).errors
    assert error.node == "spark-2" and "no ConnectX-7 port found" in error.text
    assert "neither ibdev2netdev nor `rdma link` lists a RoCE device" in error.text
    f2 = f2.model_copy(update={"missing_tools": ["ibdev2netdev", "rdma"]})
    p = propose(pair(f2=f2))
    assert "ibdev2netdev and rdma are not installed" in p.errors[0].text and p.nodes == []


def test_different_numbers_of_cabled_ports_is_an_error():
    """lab-spark-2-fresh with enP2p1s0f1np1 without carrier: spark-1 has 2 cabled ports, spark-2
    1."""
    p = propose(pair(f2=with_iface(fresh(2), T2, carrier=False)))
    (error,) = p.errors
    assert error.node == "" and "different numbers of cabled" in error.text
    assert "spark-1 2, spark-2 1" in error.text
    assert p.nodes == []


def test_no_gpu_is_an_error():
    """lab-spark-2-fresh with gpus=[]; then also nvidia-smi missing."""
    f2 = fresh(2).model_copy(update={"gpus": []})
    (error,) = propose(pair(f2=f2)).errors
    assert error.node == "spark-2" and "no GPU seen (nvidia-smi: no GPU listed)" in error.text
    f2 = f2.model_copy(update={"missing_tools": ["nvidia-smi"]})
    p = propose(pair(f2=f2))
    assert "nvidia-smi: not installed" in p.errors[0].text and p.nodes == [] and p.gpus == 0


def test_duplicate_names_are_an_error():
    """Both fresh outputs surveyed under the name 'spark'."""
    p = propose([survey(fresh(1), 1, "spark"), survey(fresh(2), 2, "spark")])
    assert [(f.node, f.text) for f in p.errors] == [
        ("spark", "two hosts have this name: name them (NAME=HOST)")]
    assert p.nodes == []


def test_docker_that_does_not_answer_is_an_error():
    """lab-spark-2-fresh with docker=None (no `docker info`)."""
    p = propose(pair(f2=fresh(2).model_copy(update={"docker": None})))
    (error,) = p.errors
    assert error.node == "spark-2" and "Docker did not answer" in error.text


# --------------------------------------------------------------------------- warnings

def test_mtu_below_min_mtu_is_a_warning_naming_it():
    """lab-spark-2-fresh with MTU 1500 on enp1s0f1np1: proposed, with a warning; the fresh pair
    against min_mtu 9216 warns about every port."""
    p = propose(pair(f2=with_iface(fresh(2), T1, mtu=1500)))
    assert p.errors == [] and len(p.nodes) == 2
    assert levels(p, "warning") == [
        f"spark-2: {T1} has MTU 1500, below nccl.minMtu 9000: preflight refuses it until the MTU "
        "is raised (README, \"The fabric\")"]
    assert p.ports["spark-2"][0].mtu == 1500
    p = propose(pair(), min_mtu=9216)
    assert len([w for w in levels(p, "warning") if "MTU 9000, below nccl.minMtu 9216" in w]) == 4


def test_a_node_that_is_not_a_dgx_spark_is_a_warning():
    """lab-spark-2-fresh with an empty /etc/dgx-release."""
    f2 = fresh(2)
    f2 = f2.model_copy(update={"os": f2.os.model_copy(update={"dgx_release": {}})})
    p = propose(pair(f2=f2))
    assert p.errors == [] and len(p.nodes) == 2
    (warning,) = [f for f in p.findings if f.level == "warning"]
    assert warning.node == "spark-2" and "not a DGX Spark" in warning.text


def test_different_gpu_counts_are_a_warning_and_every_gpu_counts():
    """lab-spark-1-fresh with its GPU listed twice."""
    f1 = fresh(1)
    f1 = f1.model_copy(update={"gpus": [*f1.gpus, GpuFacts(name="NVIDIA GB10")]})
    p = propose(pair(f1))
    assert p.gpus == 3
    assert any("different GPU counts (spark-1 2, spark-2 1)" in w for w in levels(p, "warning"))


# --------------------------------------------------------------------------- what the hosts hold

def test_seeded_head_reports_foreign_containers_images_and_the_models_cache():
    """lab-spark-1-seeded + lab-spark-2-fresh as recorded, model_repo spark-lab/tiny-moe."""
    p = propose(pair(f1=facts("lab-spark-1-seeded", "spark-1")),
                         model_repo="spark-lab/tiny-moe")
    assert p.errors == [] and len(p.nodes) == 2
    assert sorted(p.foreign["spark-1"]) == [("reranker", "vllm-node", 70475776),
                                            ("vllm_embeddings", "vllm-node", 104091648),
                                            ("vllm_node", "vllm-node", 272498688)]
    assert p.foreign["spark-2"] == []
    notes = [f for f in p.findings if f.level == "note"]
    for name, mem in (("vllm_node", "0.3"), ("reranker", "0.1"), ("vllm_embeddings", "0.1")):
        assert any(f.node == "spark-1" and f"container {name} (vllm-node, {mem} GiB) is not the "
                   "stack's" in f.text for f in notes), (name, notes)
    assert p.images == {"spark-1": ["vllm-node:latest"], "spark-2": []}
    assert p.caches["spark-1"] == [("spark-lab/tiny-moe", 64507)]
    assert [f.node for f in notes if "already holds" in f.text and "spark-lab/tiny-moe" in f.text] \
        == ["spark-1"]
    # another model: the cache is listed, no note says it holds that model
    p = propose(pair(f1=facts("lab-spark-1-seeded", "spark-1")), model_repo="org/other")
    assert p.caches["spark-1"] == [("spark-lab/tiny-moe", 64507)]
    assert not any("already holds" in f.text for f in p.findings)


def test_managed_and_stopped_containers_are_not_foreign():
    """lab-spark-1-seeded with vllm_node labelled spark-vllm.managed=true and reranker exited."""
    f1 = facts("lab-spark-1-seeded", "spark-1")
    changed = {"vllm_node": {"labels": {"spark-vllm.managed": "true"}},
               "reranker": {"state": "exited"}}
    docker = f1.docker.model_copy(update={"containers": [
        c.model_copy(update=changed.get(c.name, {})) for c in f1.docker.containers]})
    p = propose(pair(f1=f1.model_copy(update={"docker": docker})))
    assert [c[0] for c in p.foreign["spark-1"]] == ["vllm_embeddings"]
    assert len([f for f in p.findings if f.text.startswith("container ")]) == 1


# --------------------------------------------------------------------------- names and twins

def test_node_name_is_a_dns_label_from_the_hostname():
    cases = [  # (hostname as uname prints it, the host's index, the name)
        ("spark-1", 0, "spark-1"),
        ("Spark-7D19", 0, "spark-7d19"),
        ("DGX_Spark 01.lan.example", 1, "dgx-spark-01"),
        ("", 2, "spark-3"),
        ("___", 0, "spark-1"),
        ("a" * 62 + "_b" + "c" * 10, 0, "a" * 62),  # cut to 63, no trailing '-'
    ]
    for hostname, index, expected in cases:
        name = day_zero.node_name(hostname, index)
        assert name == expected, hostname
        # a name the stack's config accepts
        NodeConfig.model_validate({"name": name, "host": "10.77.0.11",
                                   "fabric": [{"interface": T1, "ip": "192.168.177.11"}]})


def _node_from_ibdev2netdev(fixture: str, name: str) -> NodeFacts:
    """A node whose RoCE list is a real GB10 ibdev2netdev output (tests/fixtures/gb10/<fixture>),
    each netdev with a carrier exactly when that output says Up."""
    roce = parsers.parse_ibdev2netdev(gb10(fixture))
    base = fresh(1)
    ifaces = [i for i in base.interfaces if i.name not in {r.netdev for r in roce}]
    ifaces += [InterfaceFacts(name=r.netdev, mtu=9000, carrier=r.state == "Up") for r in roce]
    return base.model_copy(update={"node": name, "roce": roce, "interfaces": ifaces})


def test_twin_order_on_real_names_puts_domain_0_first():
    """ibdev2netdev-playbooks-connect-two-sparks.txt lists roceP2* before rocep1*: the cabled
    ports still come as rocep1s0f1 then roceP2p1s0f1, and the down ones are named."""
    f = _node_from_ibdev2netdev("ibdev2netdev-playbooks-connect-two-sparks.txt", "spark-1")
    assert f.roce[0].device == "roceP2p1s0f0"  # as recorded
    up, down = day_zero.cabled_ports(f)
    assert [(r.device, i.name) for r, i in up] == [("rocep1s0f1", T1), ("roceP2p1s0f1", T2)]
    assert down == ["roceP2p1s0f0 ==> enP2p1s0f0np0 (no carrier)",
                    "rocep1s0f0 ==> enp1s0f0np0 (no carrier)"]
    # ibdev2netdev-playbooks-three-sparks-all-up.txt: both cages cabled, four twins
    f = _node_from_ibdev2netdev("ibdev2netdev-playbooks-three-sparks-all-up.txt", "spark-1")
    up, _ = day_zero.cabled_ports(f)
    assert [i.name for _, i in up] == ["enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0",
                                       "enP2p1s0f1np1"]
    assert day_zero.twin_index("enP2p1s0f1np1") == (2, "enP2p1s0f1np1")
    assert day_zero.twin_index("enp1s0f1np1") == (0, "enp1s0f1np1")
    # a RoCE device whose netdev the node does not show is named too
    f = fresh(2).model_copy(update={"roce": [RoceFacts(device="rocep1s0f1", netdev="gone")]})
    assert day_zero.cabled_ports(f) == ([], ["rocep1s0f1 ==> gone (no such interface)"])


def test_twins_line_up_whatever_order_a_node_lists_them_in():
    """lab-spark-2-fresh with its RoCE list in the order of ibdev2netdev-playbooks-connect-two-
    sparks.txt (roceP2* first): the proposal is the same as with the recorded order."""
    real = [r.device for r in parsers.parse_ibdev2netdev(
        gb10("ibdev2netdev-playbooks-connect-two-sparks.txt"))]
    f2 = fresh(2)
    reordered = sorted(f2.roce, key=lambda r: real.index(r.device))
    assert [r.device for r in reordered] == ["roceP2p1s0f1", "rocep1s0f1"]
    p = propose(pair(f2=f2.model_copy(update={"roce": reordered})))
    assert p.nodes == propose(pair()).nodes
    assert ipaddress.ip_address(p.nodes[1]["fabric"][0]["ip"]) in \
        ipaddress.ip_network(p.subnets[0])


def test_a_third_node_gets_the_next_address():
    """The fresh pair plus a third node from lab-spark-2-fresh with neither twin addressed (its
    name spark-3, host 10.77.0.13): .13 in both subnets, 3 GPUs."""
    f3 = with_iface(with_iface(fresh(2), T1, ipv4=[]), T2, ipv4=[])
    third = day_zero.Survey(name="spark-3", host="10.77.0.13", user="root", port=22,
                            host_key=KEY_1, facts=f3.model_copy(update={"node": "spark-3"}))
    p = propose([*pair(), third])
    assert p.errors == [] and p.gpus == 3
    assert ports(p, "spark-3") == [(T1, "192.168.177.13", False), (T2, "192.168.178.13", False)]
    assert [n["name"] for n in p.nodes] == ["spark-1", "spark-2", "spark-3"]
