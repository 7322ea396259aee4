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
    log "FAILED: $name (see $logf)"
    return 1
  fi
  log "$name: done in $((SECONDS-start)) s"
}

# Pinned sources for the offline route (offline-toolchain notes §1-§2). Override by env to retry.
LANG_HOST_MODULE="github.com/pulumi/pulumi/sdk/python/cmd/pulumi-language-python/v3"
LANG_HOST_PSEUDO="${PULUMI_LANG_HOST_PSEUDO:-v3.0.0-20260820084410-a05d88f24d05}"  # release 3.259.0
LANG_HOST_RELEASE="${PULUMI_LANG_HOST_RELEASE:-3.259.0}"
COMMAND_MODULE="github.com/pulumi/pulumi-command/provider"
COMMAND_PSEUDO="${PULUMI_COMMAND_PSEUDO:-v0.0.0-20260303235922-7f3eb6f3b77c}"       # v1.2.1
DOCKER_MODULE="github.com/pulumi/pulumi-docker/provider/v5"
DOCKER_PSEUDO="${PULUMI_DOCKER_PSEUDO:-v5.0.0-20260626165050-e944612c4c97}"        # v5.1.0
DOCKER_UPSTREAM="github.com/kreuzwerker/terraform-provider-docker"
DOCKER_UPSTREAM_PSEUDO="${PULUMI_DOCKER_UPSTREAM_PSEUDO:-v0.0.0-20260618190003-5074970c71ce}"  # v4.5.0
PY="${PYTHON:-python3}"
VENV="${VENV:-venv}"
export PULUMI_HOME="${PULUMI_HOME:-$HOME/.pulumi}"
export PULUMI_SKIP_UPDATE_CHECK=true PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
MISSING="$TC/missing.txt"
SOURCES="$TC/plugin-sources.txt"   # "name version source" for every plugin this run provided

# Resolve a module through the proxy; prints its Dir or records the refusal and returns 1.
mod_dir() { # module@version what
  local out
  out=$(go mod download -json "$1" 2>&1) || true
  local dir
  dir=$(printf '%s' "$out" | "$PY" -c 'import sys,json
try: d=json.load(sys.stdin)
except Exception: sys.exit(1)
print(d.get("Dir","")) if d.get("Dir") else sys.exit(1)' 2>/dev/null) && { echo "$dir"; return 0; }
  { echo "## $2"; echo "\$ go mod download -json $1"; printf '%s\n\n' "$out" | grep -E 'Error|403|not available|invalid' | head -3; } >>"$MISSING"
  log "$2: the Go proxy does not serve $1"
  return 1
}

online() { curl -fsS -o /dev/null --max-time 5 -I "https://get.pulumi.com/releases/sdk/pulumi-v$CLI_VERSION-linux-x64.tar.gz" 2>/dev/null; }

# ---- the CLI --------------------------------------------------------------------------------
cli_ok() { [ -x "$BIN/pulumi" ] && [ "$("$BIN/pulumi" version 2>/dev/null)" = "v$CLI_VERSION" ]; }

install_cli_official() {
  local t="$TC/work/official-$CLI_VERSION"; rm -rf "$t"; mkdir -p "$t"
  curl -fsSL --max-time 600 "https://get.pulumi.com/releases/sdk/pulumi-v$CLI_VERSION-linux-x64.tar.gz" | tar -xz -C "$t"
  cp -a "$t"/pulumi/* "$BIN/"   # pulumi, pulumi-language-python(+exec), other bundled hosts
  rm -rf "$t"
}

build_cli() {
  local w="$TC/work/pulumi-v$CLI_VERSION" pkg sdk
  rm -rf "$w"; mkdir -p "$w"
  pkg=$(mod_dir "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION" cli) || return 1
  sdk=$(mod_dir "github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION" cli) || return 1
  # Rebuild the upstream repo layout so pkg's own `../sdk` replace resolves unchanged.
  cp -r "$pkg" "$w/pkg"; cp -r "$sdk" "$w/sdk"; chmod -R u+w "$w"
  ( cd "$w/pkg" && go build -trimpath -tags osusergo,grpcnotrace \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$CLI_VERSION" \
      -o "$w/pulumi.new" ./cmd/pulumi )
  # The exec script and the dynamic-provider shim ship in the sdk module; zips drop file modes.
  cp "$sdk/python/cmd/pulumi-language-python-exec" "$BIN/"
  cp "$sdk/python/dist/pulumi-resource-pulumi-python" "$BIN/"
  chmod +x "$BIN/pulumi-resource-pulumi-python"
  mv "$w/pulumi.new" "$BIN/pulumi"   # last: a half-built CLI never sits at the final path
  rm -rf "$w"
}

ensure_cli() {
  if cli_ok; then log "cli: pulumi v$CLI_VERSION ready"; return; fi
  local onpath; onpath=$(command -v pulumi || true)
  if [ -n "$onpath" ] && [ "$("$onpath" version 2>/dev/null)" = "v$CLI_VERSION" ]; then
    ln -sf "$(readlink -f "$onpath")" "$BIN/pulumi"; log "cli: using $onpath"; return
  fi
  if online; then
    run_logged "cli: official install of v$CLI_VERSION" "$TC/logs/cli.log" install_cli_official || die "cli"
  else
    command -v go >/dev/null || die "cli: get.pulumi.com is unreachable and Go is not installed"
    run_logged "cli: go build pulumi v$CLI_VERSION (cold: ~10 min on 2 cores)" "$TC/logs/cli.log" build_cli \
      || die "cli: building github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION"
  fi
  cli_ok || die "cli: $BIN/pulumi does not report v$CLI_VERSION"
}

# ---- the Python language host ---------------------------------------------------------------
lang_ok() { [ -x "$BIN/pulumi-language-python" ] && [ -f "$BIN/pulumi-language-python-exec" ]; }

build_lang_host() {
  local w="$TC/work/lang-python" host pkg sdk
  rm -rf "$w"; mkdir -p "$w"
  host=$(mod_dir "$LANG_HOST_MODULE@$LANG_HOST_PSEUDO" "language host") || return 1
  pkg=$(mod_dir "github.com/pulumi/pulumi/pkg/v3@v$LANG_HOST_RELEASE" "language host") || return 1
  sdk=$(mod_dir "github.com/pulumi/pulumi/sdk/v3@v$LANG_HOST_RELEASE" "language host") || return 1
  cp -r "$pkg" "$w/pkg"; cp -r "$sdk" "$w/sdk"; chmod -R u+w "$w"
  mkdir -p "$w/sdk/python/cmd"; cp -r "$host" "$w/sdk/python/cmd/pulumi-language-python"
  chmod -R u+w "$w"
  ( cd "$w/sdk/python/cmd/pulumi-language-python" && go build -trimpath \
      -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$LANG_HOST_RELEASE" \
      -o "$w/host.new" . )
  mv "$w/host.new" "$BIN/pulumi-language-python"
  rm -rf "$w"
}

ensure_lang_host() {
  if lang_ok; then log "language host: ready"; return 0; fi
  if online; then run_logged "language host: official" "$TC/logs/lang.log" install_cli_official; return 0; fi
  build_lang_host 2>>"$TC/logs/lang.log" || log "language host: NOT AVAILABLE (see $MISSING)"
}

# ---- resource plugins -----------------------------------------------------------------------
# name and version each pinned SDK requests, read from its pulumi-plugin.json in the venv.
requested_plugins() {
  "$VENV/bin/python" - <<'PY'
import json, importlib.resources as r
for pkg in ("pulumi_command", "pulumi_docker"):
    d = json.loads((r.files(pkg) / "pulumi-plugin.json").read_text())
    print(d["name"], d["version"])
PY
}

plugin_ok() { [ -x "$PULUMI_HOME/plugins/resource-$1-v$2/pulumi-resource-$1" ] && [ ! -e "$PULUMI_HOME/plugins/resource-$1-v$2.partial" ]; }

install_plugin_file() { # name version binary
  "$BIN/pulumi" plugin install resource "$1" "$2" --file "$3" --reinstall >/dev/null
}

build_command_plugin() { # version
  local w="$TC/work/command-$1" src
  rm -rf "$w"; mkdir -p "$w"
  src=$(mod_dir "$COMMAND_MODULE@$COMMAND_PSEUDO" "plugin command $1") || return 1
  cp -r "$src" "$w/provider"; chmod -R u+w "$w"
  ( cd "$w/provider" && go build -trimpath \
      -ldflags "-s -w -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=v$1" \
      -o "$w/pulumi-resource-command" ./cmd/pulumi-resource-command )
  install_plugin_file command "$1" "$w/pulumi-resource-command"
  rm -rf "$w"
}

build_docker_plugin() { # version
  local w="$TC/work/docker-$1" prov up
  rm -rf "$w"; mkdir -p "$w"
  prov=$(mod_dir "$DOCKER_MODULE@$DOCKER_PSEUDO" "plugin docker $1") || return 1
  up=$(mod_dir "$DOCKER_UPSTREAM@$DOCKER_UPSTREAM_PSEUDO" "plugin docker $1 (upstream)") || return 1
  # Sibling layout: the provider's own `../upstream` replace resolves unchanged.
  cp -r "$prov" "$w/provider"; cp -r "$up" "$w/upstream"; chmod -R u+w "$w"
  # What upstream patch 0001 adds: a shim exporting the upstream provider (internal/ rule).
  mkdir -p "$w/upstream/shim"
  cat >"$w/upstream/shim/shim.go" <<'GO'
package shim

import (
	"github.com/hashicorp/terraform-plugin-sdk/v2/helper/schema"
	"github.com/terraform-providers/terraform-provider-docker/internal/provider"
)

// NewProvider returns the upstream Terraform provider for the Pulumi bridge.
func NewProvider() *schema.Provider { return provider.New("dev")() }
GO
  # schema-embed.json is generated and gitignored upstream: a compact schema.json with version.
  "$PY" -c 'import json,sys; d=json.load(open(sys.argv[1])); d["version"]=sys.argv[2]; json.dump(d,open(sys.argv[3],"w"),separators=(",",":"))' \
    "$w/provider/cmd/pulumi-resource-docker/schema.json" "$1" "$w/provider/cmd/pulumi-resource-docker/schema-embed.json"
  ( cd "$w/provider" && go build -trimpath -tags no_compose \
      -ldflags "-s -w -X github.com/pulumi/pulumi-docker/provider/v5/pkg/version.Version=$1" \
      -o "$w/pulumi-resource-docker" ./cmd/pulumi-resource-docker )
  install_plugin_file docker "$1" "$w/pulumi-resource-docker"
  rm -rf "$w"
}

ensure_plugins() {
  local name version
  while read -r name version; do
    if plugin_ok "$name" "$version"; then
      local src=installed
      cmp -s "$PULUMI_HOME/plugins/resource-$name-v$version/pulumi-resource-$name" \
        "$TC/lab-plugins/$name-$version/pulumi-resource-$name" && src=lab-standin
      log "plugin $name $version: ready ($src)"
      echo "$name $version $src" >>"$SOURCES"
      continue
    fi
    if online; then
      run_logged "plugin $name $version: pulumi plugin install" "$TC/logs/plugin-$name.log" \
        "$BIN/pulumi" plugin install resource "$name" "$version"
      echo "$name $version official" >>"$SOURCES"
      continue
    fi
    log "plugin $name $version: building from the Go module proxy"
    if "build_${name}_plugin" "$version" 2>>"$TC/logs/plugin-$name.log"; then
      echo "$name $version go-proxy" >>"$SOURCES"; continue
    fi
    log "plugin $name $version: the official plugin is NOT AVAILABLE (see $MISSING)"
    install_lab_standin "$name" "$version"
  done < <(requested_plugins)
}

# Last resort on offline machines: the lab's stand-in plugin (lab/providers/<name>/README.md),
# built from Go modules the proxy does serve. It is NOT Pulumi's released binary; it implements
# what spark-vllm uses so the lab can be driven end to end. SPARK_VLLM_NO_STANDINS=1 turns it off.
install_lab_standin() { # name version
  local script="lab/providers/$1/build.sh" bin="$TC/lab-plugins/$1-$2/pulumi-resource-$1"
  [ -z "${SPARK_VLLM_NO_STANDINS:-}" ] && [ -x "$script" ] || return 0
  run_logged "plugin $1 $2: lab stand-in build (cold: 5-15 min)" "$TC/logs/standin-$1.log" "$script" \
    || { log "plugin $1 $2: lab stand-in build failed"; return 0; }
  [ -x "$bin" ] || { log "plugin $1 $2: $script did not produce $bin"; return 0; }
  install_plugin_file "$1" "$2" "$bin"
  echo "$1 $2 lab-standin" >>"$SOURCES"
  log "plugin $1 $2: installed the LAB STAND-IN from $script (not Pulumi's released plugin)"
}

write_status() {
  "$PY" - "$TC" "$BIN" "$PULUMI_HOME" "$CLI_VERSION" <<'PY'
import json, os, sys, subprocess
tc, bin_, home, cli = sys.argv[1:]
def plugins():
    out = {}
    base = os.path.join(home, "plugins")
    for d in sorted(os.listdir(base)) if os.path.isdir(base) else []:
        # plugin folders only: the CLI keeps .lock/.lastused/.partial files next to them
        if d.startswith("resource-") and os.path.isdir(os.path.join(base, d)) \
                and not os.path.exists(os.path.join(base, d + ".partial")):
            name, _, ver = d[len("resource-"):].rpartition("-v")
            out[name] = ver
    return out
missing = open(os.path.join(tc, "missing.txt")).read() if os.path.exists(os.path.join(tc, "missing.txt")) else ""
sources = {}
if os.path.exists(os.path.join(tc, "plugin-sources.txt")):
    for line in open(os.path.join(tc, "plugin-sources.txt")):
        parts = line.split()
        if len(parts) == 3:
            sources[parts[0]] = parts[2]
status = {
    "cli": cli if os.access(os.path.join(bin_, "pulumi"), os.X_OK) else None,
    "languageHostPython": os.access(os.path.join(bin_, "pulumi-language-python"), os.X_OK),
    "plugins": plugins(),
    "pluginSources": sources,  # official | go-proxy | lab-standin
    "missing": missing,
}
json.dump(status, open(os.path.join(tc, "status.json"), "w"), indent=2)
PY
}

summary() {
  log "toolchain in $BIN (PULUMI_HOME=$PULUMI_HOME)"
  "$BIN/pulumi" version 2>/dev/null | sed 's/^/  pulumi /' >&2 || true
  "$BIN/pulumi" plugin ls 2>/dev/null | sed 's/^/  /' >&2 || true
  if [ -s "$MISSING" ]; then
    log "NOT AVAILABLE on this machine (exact commands and answers in $MISSING):"
    grep '^## ' "$MISSING" | sort -u | sed 's/^## /  - /' >&2
    if grep -q lab-standin "$SOURCES" 2>/dev/null; then
      log "LAB STAND-INS are in use instead (lab/providers/*/README.md): $(awk '$3=="lab-standin" {printf "%s %s  ", $1, $2}' "$SOURCES")"
    fi
    log "Tests that need a missing piece skip with this reason; with internet, rerun to get Pulumi's own."
  fi
}

case "${1:-all}" in
  cli) ensure_cli ;;
  status) write_status; cat "$TC/status.json" ;;
  all)
    rm -f "$MISSING"; : >"$SOURCES"
    ensure_cli
    ensure_lang_host
    ensure_plugins
    write_status
    summary ;;
  *) die "usage: $0 [all|cli|status]" ;;
esac
