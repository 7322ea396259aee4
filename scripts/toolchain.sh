#!/usr/bin/env bash
# Pulumi's own toolchain at pinned versions: the CLI, the Python language host (with its exec
# script) and the command/docker resource plugins. docs/toolchain.md explains the routes.
#
#   scripts/toolchain.sh [all]        obtain whatever is missing, then verify and write status.json
#   scripts/toolchain.sh status       print status.json
#   scripts/toolchain.sh bundle DIR   collect Pulumi's release archives + SHA256SUMS into DIR (internet)
#
# Every binary is taken from the first route that works:
#   1. installed   already present at the pinned version (warm run: a few seconds)
#   2. release     Pulumi's official release archives: from TOOLCHAIN_BUNDLE=DIR (made by `bundle`,
#                  checked against DIR/SHA256SUMS) or downloaded from get.pulumi.com when reachable
#   3. source      built from Pulumi's own source: the plugins and the language host from an offline
#                  source bundle (TOOLCHAIN_SOURCES=DIR, else ../shared/toolchain-sources next to the
#                  checkout), each tarball checked against the digest pinned below and the bundle's
#                  SHA256SUMS; the CLI and the exec script from the Go module proxy. Official
#                  version ldflags and build tags.
# Results live outside the checkout, keyed by version: $SPARK_VLLM_CACHE/toolchain/bin (CLI and
# language host) and $PULUMI_HOME/plugins (via `pulumi plugin install resource NAME VER --file`).
# A binary is moved into place only when complete; a failing step prints its name and log and
# exits 1. status.json records, for every binary, its version, route and upstream commit.
set -euo pipefail

REPO=$(CDPATH= cd -- "$(dirname -- "$0")/.." && pwd)
CACHE="${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}"
TC="$CACHE/toolchain"
BIN="$TC/bin"
PY="${PYTHON:-python3}"
VENV="${VENV:-$REPO/venv}"
export PULUMI_HOME="${PULUMI_HOME:-$HOME/.pulumi}"
export PULUMI_SKIP_UPDATE_CHECK=true PULUMI_DISABLE_AUTOMATIC_PLUGIN_ACQUISITION=true
export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build" GOFLAGS="-mod=mod" CGO_ENABLED=0
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}"

# ---- pins --------------------------------------------------------------------------------------
# The SDK wheels in requirements.txt request exactly these plugin versions (pulumi-plugin.json).
CLI_VERSION=3.274.1
# The language host ships inside the CLI's release archive (so it has the CLI's version there);
# from source it is 3.259.0, the newest release whose source could be obtained offline.
LANG_SRC_VERSION=3.259.0
COMMAND_VERSION=1.2.1
DOCKER_VERSION=5.1.0
# Upstream commits of the release tags (github.com/pulumi/pulumi-command tag v1.2.1, ...).
LANG_COMMIT=a05d88f24d05726fa3beae771bfdedb0c0c6a94a      # pulumi/pulumi tag pkg/v3.259.0
COMMAND_COMMIT=7f3eb6f3b77cd0fa3895ba437a695dd393f7dd25   # pulumi/pulumi-command tag v1.2.1
DOCKER_COMMIT=e944612c4c970123d9a16a48c40d37dc84c89a70    # pulumi/pulumi-docker tag v5.1.0
# sha256 of the source tarballs this script accepts (the bundle's own SHA256SUMS is checked too).
declare -A SRC_TARBALL=(
  [language-python]="pulumi-language-python-$LANG_SRC_VERSION-src.tar.gz"
  [command]="pulumi-resource-command-$COMMAND_VERSION-src.tar.gz"
  [docker]="pulumi-resource-docker-$DOCKER_VERSION-src.tar.gz"
)
declare -A SRC_SHA256=(
  [language-python]=eea09dd1a5a789b4573c53d7c09b5d651d4ac6cd2e9423001eaa5473ededb545
  [command]=9ee4036ad11e49f29c76bb26ea4e3f0356502051ac4d814bf0ab83eee82db700
  [docker]=96c8532d05e5845ac0bbeedb0372dc997e7a1f7926fa846f03344d4c2e2c5837
)

case "$(uname -m)" in
  x86_64) CLI_ARCH=x64 PLUGIN_ARCH=amd64 ;;
  aarch64 | arm64) CLI_ARCH=arm64 PLUGIN_ARCH=arm64 ;;
  *) echo "toolchain: unsupported machine $(uname -m)" >&2; exit 1 ;;
esac
CLI_ARCHIVE="pulumi-v$CLI_VERSION-linux-$CLI_ARCH.tar.gz"
plugin_archive() { echo "pulumi-resource-$1-v$2-linux-$PLUGIN_ARCH.tar.gz"; }
RELEASES=https://get.pulumi.com/releases

mkdir -p "$BIN" "$TC/logs" "$TC/records"
log() { printf '[toolchain %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }

# Run one named step with its output in a log; a heartbeat every 30 s on long work.
step() { # id description cmd...  (the log is logs/<id>.log)
  local logf="$TC/logs/$1.log" name=$2 start=$SECONDS pid
  shift 2
  log "$name: started (log: $logf)"
  (trap cleanup EXIT; "$@") >"$logf" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 1; done
    kill -0 "$pid" 2>/dev/null && log "$name: still running ($((SECONDS - start)) s) ... $(tail -c 100 "$logf" | tr '\n' ' ')"
  done
  if ! wait "$pid"; then
    tail -n 25 "$logf" >&2
    die "$name (full log: $logf)"
  fi
  log "$name: done in $((SECONDS - start)) s"
}

# A record per binary: name -> {version, route, commit, ...}; status.json is made from them.
record() { # name version route commit [detail]
  "$PY" - "$TC/records/$1.json" "$@" <<'PY'
import json, sys
path, name, version, route, commit, *detail = sys.argv[1:]
json.dump({"name": name, "version": version, "route": route, "commit": commit or None,
           "detail": detail[0] if detail else ""}, open(path, "w"), indent=2)
PY
}
recorded_route() { "$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["route"])' "$TC/records/$1.json" 2>/dev/null || true; }

WORK=""
cleanup() { [ -n "$WORK" ] && rm -rf "$WORK"; return 0; }
trap cleanup EXIT
workdir() { cleanup; WORK=$(mktemp -d "$TC/work.XXXXXX"); }

online() {
  [ -z "${TOOLCHAIN_OFFLINE:-}" ] && curl -fsS -o /dev/null --max-time 5 -I "$RELEASES/sdk/$CLI_ARCHIVE" 2>/dev/null
}

# The release archives: TOOLCHAIN_BUNDLE (checked once against its SHA256SUMS) or get.pulumi.com.
# Sets REL to the verified archive's path; returns 1 when this route has no such archive.
BUNDLE_CHECKED=""
REL=""
release_file() { # archive
  local f=$1 url
  REL=""
  if [ -n "${TOOLCHAIN_BUNDLE:-}" ]; then
    [ -f "$TOOLCHAIN_BUNDLE/$f" ] || return 1
    if [ -z "$BUNDLE_CHECKED" ]; then
      [ -f "$TOOLCHAIN_BUNDLE/SHA256SUMS" ] || die "release bundle $TOOLCHAIN_BUNDLE has no SHA256SUMS"
      (cd "$TOOLCHAIN_BUNDLE" && sha256sum --quiet -c SHA256SUMS) >&2 \
        || die "release bundle $TOOLCHAIN_BUNDLE: SHA256SUMS does not match its archives"
      BUNDLE_CHECKED=1
    fi
    grep -q "  $f\$" "$TOOLCHAIN_BUNDLE/SHA256SUMS" || die "release bundle: $f is not listed in its SHA256SUMS"
    REL="$TOOLCHAIN_BUNDLE/$f"
    return 0
  fi
  online || return 1
  case "$f" in
    pulumi-resource-*) url="$RELEASES/plugins/$f" ;;
    *) url="$RELEASES/sdk/$f" ;;
  esac
  mkdir -p "$TC/downloads"
  log "release: downloading $url"
  curl -fsSL --max-time 900 -o "$TC/downloads/$f.part" "$url" || die "release: download of $url"
  mv "$TC/downloads/$f.part" "$TC/downloads/$f"
  REL="$TC/downloads/$f"
}
release_route() { [ -n "${TOOLCHAIN_BUNDLE:-}" ] && echo release-bundle || echo release; }

# The offline source bundle, verified against the pinned digests and its own SHA256SUMS.
SOURCES=""
find_sources() {
  [ -n "$SOURCES" ] && return 0
  local dir origin
  if [ -n "${TOOLCHAIN_SOURCES:-}" ]; then
    [ -d "$TOOLCHAIN_SOURCES" ] || die "TOOLCHAIN_SOURCES=$TOOLCHAIN_SOURCES is not a folder"
    dir=$TOOLCHAIN_SOURCES
  elif [ -d "$REPO/../shared/toolchain-sources" ]; then
    dir="$REPO/../shared/toolchain-sources"
  else
    # A clone of a local checkout: look beside the checkout it was cloned from.
    origin=$(git -C "$REPO" remote get-url origin 2>/dev/null || true)
    [ -n "$origin" ] && [ -d "$origin/../shared/toolchain-sources" ] || return 1
    dir="$origin/../shared/toolchain-sources"
  fi
  SOURCES=$(cd "$dir" && pwd)
}
SRC=""
source_tarball() { # key: sets SRC to the verified tarball's path
  local key=$1 f sum
  f="$SOURCES/${SRC_TARBALL[$key]}"
  [ -f "$f" ] || die "source bundle $SOURCES has no ${SRC_TARBALL[$key]}"
  sum=$(sha256sum "$f" | cut -d' ' -f1)
  [ "$sum" = "${SRC_SHA256[$key]}" ] \
    || die "source bundle: ${SRC_TARBALL[$key]} has sha256 $sum, expected ${SRC_SHA256[$key]} (pinned in $0)"
  if [ -f "$SOURCES/SHA256SUMS" ]; then
    grep -q "^$sum  ${SRC_TARBALL[$key]}\$" "$SOURCES/SHA256SUMS" \
      || die "source bundle: ${SRC_TARBALL[$key]} does not match the bundle's SHA256SUMS"
  fi
  SRC=$f
}

go_mod_dir() { # module@version -> its folder in the module cache
  go mod download -json "$1" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Dir"])'
}
go_mod_sum() { go mod download -json "$1" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["Sum"])'; }

# ---- the CLI -----------------------------------------------------------------------------------
cli_ok() { [ -x "$BIN/pulumi" ] && [ "$("$BIN/pulumi" version 2>/dev/null)" = "v$CLI_VERSION" ]; }

install_cli_release() { # archive
  workdir
  tar -xzf "$1" -C "$WORK"
  [ "$("$WORK/pulumi/pulumi" version)" = "v$CLI_VERSION" ] || { echo "archive holds $("$WORK/pulumi/pulumi" version)"; return 1; }
  local f
  for f in "$WORK"/pulumi/*; do cp -a "$f" "$BIN/.$(basename "$f").new"; done
  for f in "$WORK"/pulumi/*; do mv "$BIN/.$(basename "$f").new" "$BIN/$(basename "$f")"; done
}

build_cli() {
  command -v go >/dev/null || { echo "go is not installed"; return 1; }
  workdir
  local pkg sdk
  pkg=$(go_mod_dir "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION")
  sdk=$(go_mod_dir "github.com/pulumi/pulumi/sdk/v3@v$CLI_VERSION")
  # The upstream layout, so pkg's own `../sdk` replace line resolves unchanged.
  cp -r "$pkg" "$WORK/pkg"; cp -r "$sdk" "$WORK/sdk"; chmod -R u+w "$WORK"
  (cd "$WORK/pkg" && go build -trimpath -tags osusergo,grpcnotrace \
    -ldflags "-s -w -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$CLI_VERSION" \
    -o "$WORK/pulumi" ./cmd/pulumi)
  "$WORK/pulumi" version
  mv "$WORK/pulumi" "$BIN/pulumi"
}

ensure_cli() {
  if cli_ok; then log "cli: pulumi v$CLI_VERSION ready ($(recorded_route cli || echo installed))"; return; fi
  local onpath
  onpath=$(command -v pulumi || true)
  if [ -n "$onpath" ] && [ "$("$onpath" version 2>/dev/null)" = "v$CLI_VERSION" ]; then
    ln -sf "$(readlink -f "$onpath")" "$BIN/pulumi"
    record cli "$CLI_VERSION" installed "" "$onpath"
    log "cli: using $onpath"; return
  fi
  if release_file "$CLI_ARCHIVE"; then
    step cli "cli: install $CLI_ARCHIVE" install_cli_release "$REL"
    record cli "$CLI_VERSION" "$(release_route)" "" "$CLI_ARCHIVE"
    if [ -x "$BIN/pulumi-language-python" ]; then
      record language-python "$(lang_version | sed 's/^v//')" "$(release_route)" "" "$CLI_ARCHIVE"
    fi
  else
    step cli "cli: go build pulumi v$CLI_VERSION from the Go module proxy (cold: ~10 min on 2 cores)" build_cli
    record cli "$CLI_VERSION" source "" "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION $(go_mod_sum "github.com/pulumi/pulumi/pkg/v3@v$CLI_VERSION") (the proxy gives no commit for this tag)"
  fi
  cli_ok || die "cli: $BIN/pulumi does not report v$CLI_VERSION"
}

# ---- the Python language host ------------------------------------------------------------------
lang_version() { "$BIN/pulumi-language-python" -version 2>/dev/null || true; }
lang_ok() {
  local v; v=$(lang_version)
  [ -f "$BIN/pulumi-language-python-exec" ] && { [ "$v" = "v$CLI_VERSION" ] || [ "$v" = "v$LANG_SRC_VERSION" ]; }
}

build_lang_host() {
  command -v go >/dev/null || { echo "go is not installed"; return 1; }
  workdir
  tar -xzf "$1" -C "$WORK"
  local sdk
  sdk=$(go_mod_dir "github.com/pulumi/pulumi/sdk/v3@v$LANG_SRC_VERSION")
  (cd "$WORK/sdk/python/cmd/pulumi-language-python" && go build -tags osusergo,grpcnotrace \
    -ldflags "-w -s -X github.com/pulumi/pulumi/sdk/v3/go/common/version.Version=v$LANG_SRC_VERSION" \
    -o "$WORK/pulumi-language-python" .)
  [ "$("$WORK/pulumi-language-python" -version)" = "v$LANG_SRC_VERSION" ]
  # The host refuses to start without its exec script beside it; the dynamic-provider shim
  # ships next to it. Both are in the sdk module (module zips drop file modes).
  install -m 0755 "$sdk/python/cmd/pulumi-language-python-exec" "$BIN/.pulumi-language-python-exec.new"
  install -m 0755 "$sdk/python/dist/pulumi-resource-pulumi-python" "$BIN/.pulumi-resource-pulumi-python.new"
  install -m 0755 "$WORK/pulumi-language-python" "$BIN/.pulumi-language-python.new"
  mv "$BIN/.pulumi-language-python-exec.new" "$BIN/pulumi-language-python-exec"
  mv "$BIN/.pulumi-resource-pulumi-python.new" "$BIN/pulumi-resource-pulumi-python"
  mv "$BIN/.pulumi-language-python.new" "$BIN/pulumi-language-python"
}

ensure_lang_host() {
  if lang_ok; then log "language host: $(lang_version) ready ($(recorded_route language-python || echo installed))"; return; fi
  find_sources || die "language host: not installed, no release reachable, and no source bundle (set TOOLCHAIN_SOURCES=DIR or TOOLCHAIN_BUNDLE=DIR; docs/toolchain.md)"
  source_tarball language-python
  step language-python "language host: go build pulumi-language-python v$LANG_SRC_VERSION from $SOURCES" build_lang_host "$SRC"
  record language-python "$LANG_SRC_VERSION" source "$LANG_COMMIT" "${SRC_TARBALL[language-python]} (sha256 ${SRC_SHA256[language-python]})"
  lang_ok || die "language host: $BIN/pulumi-language-python does not report a pinned version"
}

# ---- resource plugins --------------------------------------------------------------------------
plugin_dir() { echo "$PULUMI_HOME/plugins/resource-$1-v$2"; }
plugin_ok() { # name version: installed, complete, and not the old lab stand-in
  [ -x "$(plugin_dir "$1" "$2")/pulumi-resource-$1" ] && [ ! -e "$(plugin_dir "$1" "$2").partial" ] \
    && [ "$(recorded_route "plugin-$1")" != lab-standin ]
}

install_plugin() { # name version file
  "$BIN/pulumi" plugin install resource "$1" "$2" --file "$3" --reinstall
}

build_plugin() { # name version tarball
  command -v go >/dev/null || { echo "go is not installed"; return 1; }
  workdir
  tar -xzf "$3" -C "$WORK"
  case "$1" in
    command)
      (cd "$WORK/provider" && go build \
        -ldflags "-s -w -X github.com/pulumi/pulumi-command/provider/pkg/version.Version=v$2" \
        -o "$WORK/pulumi-resource-command" ./cmd/pulumi-resource-command/) ;;
    docker)
      # provider/go.mod keeps its own replace lines (../upstream and a served SDK fork).
      (cd "$WORK/provider" && go build -tags no_compose \
        -ldflags "-X github.com/pulumi/pulumi-docker/provider/v5/pkg/version.Version=$2 -s -w" \
        -o "$WORK/pulumi-resource-docker" ./cmd/pulumi-resource-docker) ;;
  esac
  install_plugin "$1" "$2" "$WORK/pulumi-resource-$1"
}

requested_plugins() { # name version, as the pinned SDK wheels request them
  "$VENV/bin/python" - <<'PY'
import json, importlib.resources as r
for pkg in ("pulumi_command", "pulumi_docker"):
    d = json.loads((r.files(pkg) / "pulumi-plugin.json").read_text())
    print(d["name"], d["version"])
PY
}

ensure_plugin() { # name version commit
  local name=$1 version=$2 commit=$3
  if plugin_ok "$name" "$version"; then
    log "plugin $name $version: ready ($(recorded_route "plugin-$name" || echo installed))"
    [ -f "$TC/records/plugin-$name.json" ] || record "plugin-$name" "$version" installed "" "found in $PULUMI_HOME/plugins"
    return
  fi
  if release_file "$(plugin_archive "$name" "$version")"; then
    step "plugin-$name" "plugin $name $version: install $(basename "$REL")" install_plugin "$name" "$version" "$REL"
    record "plugin-$name" "$version" "$(release_route)" "$commit" "$(basename "$REL")"
    return
  fi
  find_sources || die "plugin $name $version: not installed, no release reachable, and no source bundle (set TOOLCHAIN_SOURCES=DIR or TOOLCHAIN_BUNDLE=DIR; docs/toolchain.md)"
  source_tarball "$name"
  step "plugin-$name" "plugin $name $version: go build from $SOURCES (cold: 2-5 min)" build_plugin "$name" "$version" "$SRC"
  record "plugin-$name" "$version" source "$commit" "${SRC_TARBALL[$name]} (sha256 ${SRC_SHA256[$name]})"
}

ensure_plugins() {
  local want
  want=$(requested_plugins | tr '\n' ' ')
  [ "$want" = "command $COMMAND_VERSION docker $DOCKER_VERSION " ] \
    || die "plugins: the SDK wheels in $VENV request '$want', this script pins command $COMMAND_VERSION and docker $DOCKER_VERSION"
  ensure_plugin command "$COMMAND_VERSION" "$COMMAND_COMMIT"
  ensure_plugin docker "$DOCKER_VERSION" "$DOCKER_COMMIT"
}

# ---- verification and status -------------------------------------------------------------------
# Each plugin must answer GetPluginInfo with its pinned version (scripts/plugin_info.py).
verify() {
  local name version got
  for name in command docker; do
    version=$([ $name = command ] && echo "$COMMAND_VERSION" || echo "$DOCKER_VERSION")
    got=$("$VENV/bin/python" "$REPO/scripts/plugin_info.py" "$(plugin_dir $name "$version")/pulumi-resource-$name") \
      || die "verify: plugin $name $version does not answer GetPluginInfo"
    [ "$got" = "$version" ] || die "verify: plugin $name reports version $got, expected $version"
  done
}

write_status() {
  "$PY" - "$TC" "$BIN" "$PULUMI_HOME" <<'PY'
import json, os, sys
tc, bin_, home = sys.argv[1:]
records = {}
for f in sorted(os.listdir(os.path.join(tc, "records"))):
    if f.endswith(".json"):
        r = json.load(open(os.path.join(tc, "records", f)))
        records[r["name"]] = r
def entry(key, path):
    r = records.get(key) or {}
    return {"version": r.get("version"), "route": r.get("route"), "commit": r.get("commit"),
            "detail": r.get("detail", ""), "path": path if os.path.exists(path) else None}
plugins = {}
for name in ("command", "docker"):
    r = records.get(f"plugin-{name}") or {}
    path = os.path.join(home, "plugins", f"resource-{name}-v{r.get('version')}", f"pulumi-resource-{name}")
    plugins[name] = entry(f"plugin-{name}", path)
status = {
    "cli": entry("cli", os.path.join(bin_, "pulumi")),
    "languageHost": entry("language-python", os.path.join(bin_, "pulumi-language-python")),
    "plugins": plugins,
    "bin": bin_,
    "pulumiHome": home,
}
json.dump(status, open(os.path.join(tc, "status.json"), "w"), indent=2)
PY
}

summary() {
  log "toolchain in $BIN (PULUMI_HOME=$PULUMI_HOME):"
  "$PY" - "$TC/status.json" >&2 <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
rows = [("pulumi", s["cli"]), ("pulumi-language-python", s["languageHost"])]
rows += [(f"plugin {n}", e) for n, e in s["plugins"].items()]
for name, e in rows:
    commit = (e.get("commit") or "")[:12]
    print(f"  {name:24} {e.get('version') or '-':9} {e.get('route') or '-':15} {commit}")
PY
}

# ---- make toolchain-bundle: Pulumi's release archives for an air-gapped machine ----------------
collect_bundle() { # DIR
  local dir=$1 f
  [ -n "$dir" ] || die "bundle: give a folder: scripts/toolchain.sh bundle DIR"
  mkdir -p "$dir"
  for f in "$CLI_ARCHIVE" "$(plugin_archive command "$COMMAND_VERSION")" "$(plugin_archive docker "$DOCKER_VERSION")"; do
    case "$f" in pulumi-resource-*) url="$RELEASES/plugins/$f" ;; *) url="$RELEASES/sdk/$f" ;; esac
    log "bundle: $url"
    curl -fsSL --max-time 900 -o "$dir/$f.part" "$url" || die "bundle: download of $url"
    mv "$dir/$f.part" "$dir/$f"
  done
  # Cross-check the CLI archive against Pulumi's own published checksums.
  if curl -fsSL --max-time 60 -o "$dir/pulumi-$CLI_VERSION-checksums.txt" "$RELEASES/sdk/pulumi-$CLI_VERSION-checksums.txt"; then
    (cd "$dir" && grep "  $CLI_ARCHIVE\$" "pulumi-$CLI_VERSION-checksums.txt" | sha256sum -c -) >&2 \
      || die "bundle: $CLI_ARCHIVE does not match Pulumi's published checksums"
  else
    log "bundle: Pulumi's checksum file for $CLI_VERSION was not reachable; SHA256SUMS records what was downloaded"
  fi
  (cd "$dir" && sha256sum pulumi-*.tar.gz > SHA256SUMS)
  log "bundle: $dir ready; on the offline machine: make setup TOOLCHAIN_BUNDLE=$dir"
}

case "${1:-all}" in
  all)
    # A record left by an earlier version of this script that installed the lab's stand-ins.
    if [ -f "$TC/status.json" ] && grep -q lab-standin "$TC/status.json"; then
      for n in command docker; do record "plugin-$n" "?" lab-standin ""; done
    fi
    ensure_cli
    ensure_lang_host
    ensure_plugins
    verify
    write_status
    summary ;;
  status) write_status; cat "$TC/status.json" ;;
  bundle) collect_bundle "${2:-}" ;;
  *) die "usage: $0 [all|status|bundle DIR]" ;;
esac
