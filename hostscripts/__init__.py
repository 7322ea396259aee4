"""What the stack runs on the nodes: shell scripts built by pure functions, and the Python
programs they carry (payloads/), as files.

Why apart from the components: every remote step is reviewable in one place, the text is what
`pulumi preview` diffs (so a changed script is a visible change; tests/unit/golden locks it), and
the lab can run the very same scripts against the simulated Sparks. Rules every script follows:

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

    common.py    quoting, labels, HF cache names, reading payload files, a seeder's run token
    paths.py     places and ports on the nodes: the fixed ones, and each stack's (StackNames)
    foreign.py   stopping and giving back foreign containers
    images.py    the image copy from the head (seeder, pull)
    models.py    model fetch, seeder, sync, verify
    ray.py       Ray readiness, the Ray token file, the stack's compile-cache folder
    firewall.py  the mp rendezvous port kept on the fabric (a rule on the head)
    vllm.py      vLLM argv, start (health gate), stop
    gateway.py   the gateway's haproxy.cfg, the scripts that write, check and reload it, its gate
    firewall.py  mp's rendezvous port kept to loopback and the fabric (the head's filter)
    payloads/    the Python programs the scripts run on the nodes
"""
