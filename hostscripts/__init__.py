"""What the stack runs on the nodes: shell scripts built by pure functions, and the Python
programs they carry (payloads/), as files.

Why apart from the components: every remote step is reviewable in one place, the text is what
`pulumi preview` diffs (so a changed script is a visible change; tests/unit/components/golden
locks it), and the lab can run the very same scripts against the simulated Sparks. Rules every
script follows:

* POSIX sh, `set -eu`, idempotent (safe to re-run after a partial failure).
* Every value interpolated into a script goes through `shlex.quote`; a value in a comment line
  or an unquoted echo word goes through `common.plain` (quoting does not protect a comment).
* Secrets are never interpolated: they arrive on stdin (the Command's `stdin`) and are piped
  straight into the process that needs them.
* Helper containers the scripts start carry the ownership labels, so recon never reports them
  as foreign containers.
* No script reads the provider's PULUMI_COMMAND_STDOUT/STDERR, so every Command sets
  `add_previous_output_in_env=False`, and no Command passes `environment`: pulumi-command fails
  a command whose variables the node's sshd does not accept (AcceptEnv).

    common.py        quoting, labels, HF cache names, payload files with their preludes, a
                     seeder's run token, removing a stack's path (stack_path_remove)
    paths.py         places and ports on the nodes: the fixed ones, and each stack's (StackNames)
    foreign.py       stopping and giving back foreign containers
    images.py        the image copy from the head (seeder, pull)
    models.py        model fetch, seeder, sync, verify
    ray.py           Ray readiness, the Ray token file, the stack's compile-cache folder
    vllm.py          vLLM argv, start (health gate), stop
    deployment.py    a model's verified deployment: the payload's arguments, the gate's answer
    collective.py    the collective bandwidth gate: a rank per node, the check on the head
    fabric.py        the fabric's check: an unfragmented ping at the MTU on every link
    fabric_config.py the fabric's configuration on a node (netplan file, the live interface)
    firewall.py      the node's nftables table (its unit, recon's check, the launcher's probe)
    guard.py         the node's guard: drop-ins, earlyoom, the kill hook and its record
    gateway.py       the gateway's haproxy.cfg, the scripts that write, check, reload it, its gate
    monitoring.py    Prometheus's files, the exporters, the scripts that write and reload them
    alertmanager.py  Alertmanager's configuration, its check and reload
    daemon.py        what the gateway, Prometheus and Alertmanager share: a configured daemon on
                     the head (versioned config, key file, reload, removal, its gate)
    logs.py          `spark-vllm logs`'s node script: the stack's container logs, framed
    payloads/        the Python programs the scripts run on the nodes, and the preludes joined
                     in front of them (common.PRELUDES; the manifest rules: contract/manifest.py)

(tests/unit/test_package_indexes.py holds this list to the package's modules.)
"""
