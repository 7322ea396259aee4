"""End-to-end fixtures: the real engine, real plugins, real SSH and Docker, against the lab.

The lab (lab/lab.py) is brought up once per session (idempotent). Every stack is a copy of the
project's Pulumi.dev.yaml in a temporary folder with a file backend there, so the repository's
stack file is never modified by a test run; the program is the project's own `__main__.py`, run
by the CLI through the Python language host.

One converged stack for the session (`shared`): the modules that only need a serving stack
share it instead of each converging its own from empty (~100 s each) and destroying it. The
first module that asks for it brings it up from empty (and records what that up did, for
test_lab_stack's from-empty test); every module starts by asserting that `preview` wants no
change, so a module that leaves the stack broken or changed fails there, loudly, instead of
spoiling the next module's results. The modules run in the order below (`MODULE_ORDER`): each
builds on the config the previous ones left (a flag, a revision, the executor), and the last
one destroys the stack as its own test. A module whose case must start from empty (a second
stack beside the first) still makes its own.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import time
from dataclasses import dataclass, field

import pytest

from lab.deployments import (
    LAB_CACHE,
    Deployment,
    _plugin_installed,
    destroy_unless_kept,
    lab,
    lock_lab,
    new_deployment,
    remove_leftover_stack_containers,
)
from tests import reporting

# The run order of the modules (pytest's default is alphabetical). Modules not listed run after
# these, alphabetically. Why this order: docs/testing.md.
MODULE_ORDER = (
    "test_vllm_flags.py",  # no stack: vLLM's own parser in the image
    "test_lab_stack.py",  # the shared stack from empty, then the change table (Ray, 2 nodes)
    "test_policy_pack_engine.py",  # previews of the converged stack with the pack
    "test_fabric.py",  # the fabric changed behind the stack, refused and failed fabric changes
    "test_collective.py",  # the fabric at speed: the collective gate refuses a throttled link
    "test_firewall.py",  # the nodes' firewall: the operator's services, tables drifted by hand
    "test_faults.py",  # faults and secrets, each undone
    "test_self_healing.py",  # crashes healed without an `up`
    # issue 46 on the Ray stack: shared memory, the token, links in the cache, image labels,
    # idle connections at the gateway
    "test_security.py",
    # a real community recipe imported and served; a drafter of another repo (issue 44); undone
    "test_recipe_serve.py",
    "test_two_stacks.py",  # a second stack (from empty) beside the shared one
    "test_init.py",  # `spark-vllm init` of the lab's nodes; its stack only previewed beside dev
    "test_change_image_and_nodes.py",  # image change; a third node joins and leaves
    "test_executor_mp.py",  # the shared stack switches to vLLM's mp executor
    # an embedding service beside the main model, left in place for test_gateway
    "test_services.py",
    # the gateway (issue 30) on the mp stack: without Ray, whose servers listen on every
    # address by themselves (token-guarded: test_lab_stack), the scan of the management
    # addresses can demand the gateway and sshd only, and mp's rendezvous port is on the head
    "test_gateway.py",
    "test_promote_round_trip.py",  # dev -> staging, staging from empty beside dev (mp)
    # Prometheus turned on, its targets, a counter, an alert, a reload; off again (its ports on
    # the head are then free for any stack beside this one)
    "test_monitoring.py",
    # the nodes' guard (issue 48): a drift repaired, then a node's memory exhausted from inside
    # vLLM (monitoring on for its alert, off again); after every module that needs a quiet node
    "test_node_guard.py",
    "test_seed_scenario.py",  # foreign containers stopped and started again; destroys the stack
)

HEAD, WORKER = "spark-1", "spark-2"
FABRIC_IFACES = ("enp1s0f1np1", "enP2p1s0f1np1")
MODEL_DIR = "/root/.cache/huggingface/hub/models--spark-lab--tiny-moe"


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(MODULE_ORDER)}
    items.sort(key=lambda item: rank.get(item.path.name, len(MODULE_ORDER)))  # stable sort


@pytest.fixture(scope="session")
def lab_cfg():
    """Bring the 2-node lab up (idempotent) and return what it wrote to stack.json. What is
    missing fails the session: the e2e tier exists to run against the lab."""
    if os.geteuid() != 0:
        pytest.fail("the lab needs root (network namespaces, a dockerd per simulated Spark)")
    if shutil.which("pulumi") is None:
        pytest.fail("the Pulumi CLI is not on PATH: run `make setup`")
    for name in ("command", "docker"):
        if not _plugin_installed(name):
            pytest.fail(f"resource plugin {name} is not installed (see toolchain status.json)")
    held = lock_lab()  # released when the session's process ends
    t0 = time.monotonic()
    lab("up", "--nodes", os.environ.get("E2E_NODES", "2"))
    print(f"lab up: {time.monotonic() - t0:.1f} s")
    cfg = json.loads((LAB_CACHE / "stack.json").read_text())
    remove_leftover_stack_containers(cfg)
    yield json.loads((LAB_CACHE / "stack.json").read_text())
    held.close()


@dataclass
class FirstUp:
    """What the shared stack's up from empty did (test_lab_stack asserts on it)."""

    result: str
    ops: dict[str, str]
    seconds: float
    worker_fabric_rx: int  # bytes the worker received on its primary fabric twin during the up


@dataclass
class SharedStack:
    """The session's converged `dev` stack (see the module docstring)."""

    d: Deployment
    first_up: FirstUp | None = None
    destroyed: bool = False
    modules: list[str] = field(default_factory=list)
    # the session's failure count and the stack file (with the nodes) as the last module began
    failed_at_begin: int = 0
    began_with: tuple[str, dict] | None = None

    def begin(self, module: str, failed: int) -> Deployment:
        """The converged stack for `module`: brought up from empty on first use; afterwards a
        preview must want no change. If it wants one, the stack is converged again (so the
        modules after this one run) and this module fails, naming the change. A module before
        it that failed (`failed`: the session's count of failures so far) may have left a
        change of its own in the stack file (a faulty image): the stack file it began with is
        put back and converged first, so one failure does not fail every module after it."""
        if self.destroyed:
            pytest.fail(f"{module}: the shared stack was destroyed by {self.modules[-1]}")
        if self.first_up is None:
            self.first_up = self._up_from_empty()
            if self.first_up.result != "succeeded":
                pytest.fail(f"{module}: the shared stack's up from empty {self.first_up.result}")
        else:
            if failed > self.failed_at_begin and self.began_with is not None:
                self.put_back(module)
            self.d.run("preview")
            changes = self.d.ops()
            if changes:
                before = self.modules[-1] if self.modules else "?"
                r = self.d.run("up")
                pytest.fail(f"{module}: the shared stack is not converged after {before}: "
                            f"preview wants {changes}; an up ({r.summary.result}) converged "
                            "it again for the modules after this one")
        self.modules.append(module)
        self.failed_at_begin = failed
        self.began_with = (self._stack_file().read_text(), copy.deepcopy(self.d.cfg))
        return self.d

    def _stack_file(self):
        return self.d.workdir / f"Pulumi.{self.d.stack.name}.yaml"

    def put_back(self, module: str) -> None:
        """The stack file the last module began with, converged, when that module left another
        (see `begin`; a module whose lab changes under it calls this itself, before)."""
        assert self.began_with is not None
        text, cfg = self.began_with
        before = self.modules[-1] if self.modules else "?"
        if self._stack_file().read_text() == text:
            return  # the failed module left its stack file as it found it
        print(f"{module}: {before} failed with its stack file changed: putting back the one it "
              "began with, and converging it")
        self._stack_file().write_text(text)
        self.d.cfg = copy.deepcopy(cfg)
        try:
            self.d.run("up")
        except Exception as e:  # the Automation API's CommandError and others
            pytest.fail(f"{module}: {before} failed, and the stack file it began with does not "
                        f"converge again: {str(e)[-2000:]}")

    def _up_from_empty(self) -> FirstUp:
        d = self.d
        # The worker starts without the model (the head may keep its copy: the cache is
        # retained), so its copy must cross the fabric from the head's seeder.
        d.ssh(WORKER, f"rm -rf {MODEL_DIR}")
        # Every node's ConnectX-7 ports as a fresh Spark has them (the lab tier configured them
        # for its own tests): no address, MTU 1500, no netplan file; the up configures them.
        for node in (HEAD, WORKER):
            d.ssh(node, "rm -f /etc/netplan/40-spark-vllm-*.yaml; for i in " + " ".join(
                FABRIC_IFACES) + "; do ip addr flush dev $i; ip link set dev $i mtu 1500; done")
        rx = "cat /sys/class/net/enp1s0f1np1/statistics/rx_bytes"
        before = int(d.ssh(WORKER, rx).strip())
        t0 = time.monotonic()
        r = d.run("up")
        secs = time.monotonic() - t0
        reporting.record("shared stack: up from empty (2 nodes, Ray, TP 2)", secs)
        return FirstUp(r.summary.result, d.ops(), secs, int(d.ssh(WORKER, rx).strip()) - before)


@pytest.fixture(scope="session")
def shared(lab_cfg, tmp_path_factory):
    s = SharedStack(new_deployment(tmp_path_factory.mktemp("e2e-shared"), lab_cfg))
    yield s
    if s.first_up is not None and not s.destroyed:  # its own last test did not run
        destroy_unless_kept(s.d)


@pytest.fixture(scope="module")
def stack(shared, request) -> Deployment:
    """The shared converged stack, checked quiet for this module (SharedStack.begin)."""
    return shared.begin(request.module.__name__.rsplit(".", 1)[-1] + ".py",
                        request.session.testsfailed)
