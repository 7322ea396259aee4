#!/usr/bin/env bash
# make demo: the lab up, the dev stack converged with the plain Pulumi CLI and the policy pack,
# a completion from the served model. Leaves the stack serving; touches no tracked file.
set -euo pipefail
cd "$(dirname "$0")/.."
stack="${1:-dev}"
say() { printf '\n== %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "make demo: the lab needs root (network namespaces, dockerd per node)" >&2; exit 1; }
command -v pulumi >/dev/null || { echo "make demo: pulumi is not on PATH (make setup; docs/toolchain.md)" >&2; exit 1; }

# One user of the lab at a time: the test suites take the same lock.
exec 9>>/run/spark-vllm-lab.lock
flock -n 9 || { echo "make demo: waiting for the lab (a test run holds /run/spark-vllm-lab.lock)"; flock 9; }
export SPARK_VLLM_LAB_SESSION=$$  # lab/layout.py: the lab.py runs below are this session's

say "lab: bringing up the simulated Sparks (python3 lab/lab.py up)"
python3 lab/lab.py up --nodes "${NODES:-2}"

pack=(--policy-pack policies --policy-pack-config "policies/config.$stack.json")
pulumi stack select "$stack" --create >/dev/null
# The preview runs the program, which (after recon and preflight) writes the stack's known_hosts
# from the pinned keys; `up --refresh` refreshes with the providers' settings from the state
# before the program runs, so on a machine whose file is missing or stale it would find no key.
say "pulumi preview -s $stack (what the up will change)"
pulumi preview -s "$stack" "${pack[@]}"
say "pulumi up -s $stack --refresh (policy pack policies/, config policies/config.$stack.json)"
pulumi up -s "$stack" --yes --refresh "${pack[@]}"

endpoint=$(pulumi stack output -s "$stack" endpoint)
model=$(pulumi stack output -s "$stack" servedModelName)
# The API key is a stack secret: it goes to curl on stdin (a curl config), never on a command line.
key=$(pulumi stack output -s "$stack" vllmApiKey --show-secrets)
api() { printf 'header = "Authorization: Bearer %s"\n' "$key" | curl -fsS -K - "$@"; }
say "endpoint: $endpoint (model $model)"
api "$endpoint/models"; echo
say "a completion through the OpenAI API"
api "$endpoint/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$model\", \"prompt\": \"Say hello from two Sparks\", \"max_tokens\": 16}"
echo

# Prometheus (monitoring.enabled, on in the lab's dev stack): its targets as it sees them now,
# asked on the head's loopback over ssh, as an operator would (README "Metrics and alerts")
mon=$(pulumi stack output -s "$stack" monitoring --json 2>/dev/null || echo null)
if [ "$mon" != null ]; then
  url=$(printf '%s' "$mon" | python3 -c 'import json, sys; print(json.load(sys.stdin)["url"])')
  head=$(pulumi stack output -s "$stack" nodes --json | python3 -c \
    'import json, sys; print(next(n for n, v in json.load(sys.stdin).items() if v["role"] == "head"))')
  say "monitoring: Prometheus at $url on $head, its targets"
  python3 lab/lab.py ssh "$head" python3 - "$url" <<'PY'
import json, sys, urllib.request
targets = json.load(urllib.request.urlopen(sys.argv[1] + "/api/v1/targets", timeout=10))
for t in targets["data"]["activeTargets"]:
    labels = t["labels"]
    # a model's target is one replica of it (issue 50): <model>@<node>
    who = f"{labels['model']}@{labels.get('replica', '?')}" if "model" in labels else labels.get("node")
    print(f"  {labels['job']:<5} {who:<32} {t['health']}")
PY
fi
