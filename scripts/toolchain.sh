#!/usr/bin/env bash
# Ensure the Pulumi toolchain the project needs: the CLI, the Python language host (+ exec script)
# and the command/docker resource plugins at exactly the versions requirements.txt asks for.
#
# Sources, in order: (1) already installed with matching versions; (2) Pulumi's official installer
# when get.pulumi.com is reachable; (3) build from the Go module proxy. Results are cached outside
# the repository under $SPARK_VLLM_CACHE (default ~/.cache/spark-vllm), keyed by version, so a
# second run does nothing. A step that cannot be done names itself and the Go module it needed.
#
# Output: $SPARK_VLLM_CACHE/toolchain/bin (pulumi, pulumi-language-python, ...) and the plugin
# cache $PULUMI_HOME/plugins. Prints a summary; exit 0 when the CLI is usable, with a list of what
# is missing (status file: $SPARK_VLLM_CACHE/toolchain/status.json).
set -euo pipefail

CACHE="${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}"
# The SDK on PyPI is 3.272.0; the proxy does not serve pkg/v3 v3.272.0 (no pkg/ tag), so the CLI
# is built at the nearest served release. A newer CLI than the SDK is normal for Pulumi.
CLI_VERSION="${PULUMI_CLI_VERSION:-3.274.1}"
TC="$CACHE/toolchain"
BIN="$TC/bin"
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS="-mod=mod" CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"
mkdir -p "$BIN" "$TC/work" "$TC/logs"

log() { printf '[toolchain %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# Show progress for a long step: run it with output in a log, print a heartbeat every 30 s.
run_logged() { # name logfile cmd...
  local name=$1 logf=$2; shift 2
  log "$name: started (log: $logf)"
  local start=$SECONDS
  ( "$@" ) >"$logf" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 30
    kill -0 "$pid" 2>/dev/null && log "$name: still running ($((SECONDS-start)) s) ... $(tail -c 120 "$logf" | tr '\n' ' ' | tail -c 100)"
  done
  if ! wait "$pid"; then
    tail -n 30 "$logf" >&2
    die "$name (see $logf)"
  fi
  log "$name: done in $((SECONDS-start)) s"
}

# ---- the CLI -------------------------------------------------------------------------------
cli_ok() { [ -x "$BIN/pulumi" ] && "$BIN/pulumi" version 2>/dev/null | grep -qx "v$CLI_VERSION"; }

build_cli() {
  command -v go >/dev/null || die "cli: Go is not installed (need >= 1.26)"
  local w="$TC/work/pulumi-v$CLI_VERSION"
  rm -rf "$w"; mkdir -p "$w"
  local pkg sdk
  pkg=$(go mod download -json "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION" | python3 -c 'import sys,json;d=json.load(sys.stdin);print(d.get("Dir") or sys.exit(d.get("Error")))') \
    || die "cli: module github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION is not served by the Go proxy"
  sdk=$(go mod download -json "github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION" | python3 -c 'import sys,json;d=json.load(sys.stdin);print(d.get("Dir") or sys.exit(d.get("Error")))') \
    || die "cli: module github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION is not served by the Go proxy"
  # Rebuild the upstream repo layout so pkg's own `../sdk` replace resolves unchanged.
  cp -r "$pkg" "$w/pkg"; cp -r "$sdk" "$w/sdk"; chmod -R u+w "$w"
  ( cd "$w/pkg" && go build -trimpath -tags osusergo,grpcnotrace \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$CLI_VERSION" \
      -o "$w/pulumi.new" ./cmd/pulumi )
  # The exec script and the dynamic-provider shim ship in the sdk module; zips drop file modes.
  cp "$sdk/python/cmd/pulumi-language-python-exec" "$w/"
  cp "$sdk/python/dist/pulumi-resource-pulumi-python" "$w/"
  chmod +x "$w/pulumi-resource-pulumi-python"
  mv "$w/pulumi-language-python-exec" "$w/pulumi-resource-pulumi-python" "$BIN/"
  mv "$w/pulumi.new" "$BIN/pulumi"   # last: a half-built CLI never sits at the final path
  rm -rf "$w"
}

if [ "${1:-}" = "cli" ]; then
  cli_ok && { log "cli: v$CLI_VERSION already built"; exit 0; }
  run_logged "cli: go build pulumi v$CLI_VERSION" "$TC/logs/cli.log" build_cli
  exit 0
fi
