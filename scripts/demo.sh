#!/usr/bin/env bash
# make demo: the lab up, the dev stack converged with the policy pack, a completion shown.
# Runs the program inline through the Automation API (scripts/stackctl.py), so it works with
# only the Pulumi CLI and the plugins `make setup` provided.
set -euo pipefail
cd "$(dirname "$0")/.."
stack="${1:-dev}"
say() { printf '\n== %s\n' "$*"; }

[ "$(id -u)" = 0 ] || { echo "make demo: the lab needs root (network namespaces, dockerd per node)" >&2; exit 1; }
status="$HOME/.cache/spark-vllm/toolchain/status.json"
for p in command docker; do
  if ! venv/bin/python -c "import json,sys; sys.exit(0 if '$p' in json.load(open('$status'))['plugins'] else 1)" 2>/dev/null; then
    echo "make demo: resource plugin '$p' is not installed; see $status and docs/toolchain.md" >&2
    exit 1
  fi
done

# One user of the lab at a time: the test suites take the same lock.
exec 9>>/run/spark-vllm-lab.lock
flock -n 9 || { echo "make demo: waiting for the lab (a test run holds /run/spark-vllm-lab.lock)"; flock 9; }

say "lab: bringing up the simulated Sparks (python3 lab/lab.py up)"
python3 lab/lab.py up --nodes "${NODES:-2}"
say "lab: writing host keys and the image digest into Pulumi.$stack.yaml"
python3 lab/lab.py config --write-stack "Pulumi.$stack.yaml" >/dev/null

say "pulumi up -s $stack --refresh (inline program, policy pack policies/run-pack)"
venv/bin/python scripts/stackctl.py up --stack "$stack" --policy --refresh

endpoint=$(venv/bin/python scripts/stackctl.py outputs --stack "$stack" --json | venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["endpoint"])')
model=$(venv/bin/python scripts/stackctl.py outputs --stack "$stack" --json | venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["servedModelName"])')
say "endpoint: $endpoint (model $model)"
curl -fsS "$endpoint/models"; echo
say "a completion through the OpenAI API"
curl -fsS "$endpoint/completions" -H 'Content-Type: application/json' \
  -d "{\"model\": \"$model\", \"prompt\": \"Say hello from two Sparks\", \"max_tokens\": 16}"
echo
