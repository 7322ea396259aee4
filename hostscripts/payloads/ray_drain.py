# Run in the Ray head container by the ray-ready step (hostscripts/ray.py ray_ready), only when
# `ray status` shows more nodes than the stack declares: argv = the stack's nodes' Ray addresses.
# A node that left the stack keeps its raylet until Pulumi deletes its Ray container, last in
# the update, after vLLM's new container has started and placed its ranks; a rank placed on the
# leaving node dies with it. `ray drain-node` (Ray's GCS DrainNode, what Ray's autoscaler uses
# before it terminates a node) makes that node refuse new work, so vLLM places its ranks on the
# stack's nodes only. Exits non-zero, with Ray's message, when a drain is refused.

import subprocess
import sys

import ray

keep = set(sys.argv[1:])
ray.init(address="auto", logging_level="ERROR", log_to_driver=False)
try:
    gone = [n for n in ray.nodes() if n.get("Alive") and n.get("NodeManagerAddress") not in keep]
finally:
    ray.shutdown()
for n in gone:
    ip, node_id = n.get("NodeManagerAddress"), n.get("NodeID")
    r = subprocess.run(["ray", "drain-node", "--node-id", node_id,
                        "--reason", "DRAIN_NODE_REASON_PREEMPTION",
                        "--reason-message", "it left the spark-vllm stack"],
                       capture_output=True, text=True, check=False)
    if r.returncode != 0:
        sys.exit("ray drain-node of %s (%s) failed: %s" % (ip, node_id, (r.stderr or r.stdout).strip()))
    print("drained Ray node %s: not one of the stack's nodes" % ip, flush=True)
