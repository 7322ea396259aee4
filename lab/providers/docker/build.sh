#!/usr/bin/env bash
# Build the LAB STAND-IN docker resource plugin (pulumi-resource-docker, labelled 5.1.0) from the
# upstream Terraform provider pulumi-docker wraps plus pulumi-terraform-bridge. See README.md.
#
#   lab/providers/docker/build.sh            # no-op when the binary is up to date
#   FORCE=1 lab/providers/docker/build.sh    # rebuild anyway
#
# Output: $CACHE/toolchain/lab-plugins/docker-5.1.0/pulumi-resource-docker (+ schema.json next to it).
# The binary is written to a temporary name and moved into place only after it answers -version,
# so the final path never holds a half-built file.
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
REPO=$(cd "$HERE/../../.." && pwd)
CACHE=${SPARK_VLLM_CACHE:-/root/.cache/spark-vllm}

VERSION=5.1.0                                   # what pulumi_docker==5.1.0 asks the engine for
MODULE=spark-vllm.lab/providers/docker
UPSTREAM_PATH=github.com/kreuzwerker/terraform-provider-docker   # its go.mod says github.com/terraform-providers/terraform-provider-docker
# kreuzwerker v4.5.0 (v0.0.0-20260618190003-5074970c71ce, what pulumi-docker 5.1.0 used) is refused
# by the proxy (403); this is the neighbouring served commit (v4.6.0 + later fixes). See README.md.
UPSTREAM_VER=${UPSTREAM_VER:-v0.0.0-20260916201441-96d331c98ff4}
GO_MIN=1.25.9

export GOMODCACHE=$CACHE/go/mod GOCACHE=$CACHE/go/build
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOTOOLCHAIN=${GOTOOLCHAIN:-local}
WORK=$CACHE/toolchain/work/lab-docker
OUT_DIR=$CACHE/toolchain/lab-plugins/docker-$VERSION
OUT=$OUT_DIR/pulumi-resource-docker
LOGS=$CACHE/toolchain/logs
PY=${PYTHON:-$REPO/venv/bin/python}
TAGS=no_compose   # upstream tag: drops docker_compose (pulls darwin cgo deps; not exposed by Pulumi)
LDFLAGS="-s -w -X $MODULE/version.Version=$VERSION"

step=0
say() { step=$((step + 1)); printf '[lab-docker %d/7] %s\n' "$step" "$*"; }
die() { printf 'lab-docker: FAILED: %s\n' "$*" >&2; exit 1; }

# Run a go command with a progress line every 20 s; on failure, name the module(s)/package(s).
run_go() {
  local what=$1; shift
  local log=$LOGS/lab-docker-$what.log
  local t0=$SECONDS
  ( cd "$HERE" && "$@" ) >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    sleep 20
    kill -0 "$pid" 2>/dev/null || break
    printf '  ... %s: %ds, %d packages compiled, last: %s\n' "$what" $((SECONDS - t0)) \
      "$(grep -cv '^go: ' "$log" || true)" "$(grep -v '^go: ' "$log" | tail -1 | cut -c1-90)"
  done
  if ! wait "$pid"; then
    echo "--- last lines of $log:" >&2
    tail -25 "$log" >&2
    local culprits
    culprits=$(grep -oE '([a-z0-9.-]+\.[a-z]+/[^ :@]+)@v[^ :]+' "$log" | sort -u | head -5 || true)
    [ -n "$culprits" ] || culprits=$(grep -E '^# ' "$log" | sed 's/^# //' | sort -u | head -5 || true)
    die "$what (go $*): failing module/package: ${culprits:-see $log}"
  fi
  printf '  %s done in %ds\n' "$what" $((SECONDS - t0))
}

mkdir -p "$WORK/bin" "$OUT_DIR" "$LOGS"

# Everything that determines the binary: sources, module files, this script, upstream pin, go.
stamp=$( { cd "$HERE" && cat go.mod go.sum build.sh check_mapping.py _shim/shim.go \
             $(find provider version cmd -name '*.go' | sort); \
           echo "$UPSTREAM_VER $VERSION $TAGS"; go version; } | sha256sum | cut -d' ' -f1)
if [ -z "${FORCE:-}" ] && [ -x "$OUT" ] && [ "$(cat "$OUT_DIR/.stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "lab-docker: up to date: $OUT ($("$OUT" -version))"
  exit 0
fi

say "checking go (need >= $GO_MIN)"
gov=$(go env GOVERSION | sed 's/^go//')
[ "$(printf '%s\n%s\n' "$GO_MIN" "$gov" | sort -V | head -1)" = "$GO_MIN" ] || die "go $gov is older than $GO_MIN"

say "fetching upstream $UPSTREAM_PATH@$UPSTREAM_VER from the module proxy"
dl=$(cd "$WORK" && go mod download -json "$UPSTREAM_PATH@$UPSTREAM_VER" 2>&1 || true)
src=$(printf '%s' "$dl" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
[ -n "$src" ] && [ -d "$src" ] || die "module $UPSTREAM_PATH@$UPSTREAM_VER not obtainable: $(printf '%s' "$dl" | grep -m1 Error)"
declared=$(sed -n 's/^module //p' "$src/go.mod")
[ "$declared" = "github.com/terraform-providers/terraform-provider-docker" ] \
  || die "module $UPSTREAM_PATH@$UPSTREAM_VER declares '$declared', not the path go.mod replaces"

say "preparing the writable upstream copy with the shim package ($WORK/upstream)"
marker="$UPSTREAM_VER $(sha256sum "$HERE/_shim/shim.go" | cut -d' ' -f1)"
if [ "$(cat "$WORK/upstream/.svl-source" 2>/dev/null)" != "$marker" ]; then
  rm -rf "$WORK/upstream.tmp" "$WORK/upstream"
  cp -r "$src" "$WORK/upstream.tmp"
  chmod -R u+w "$WORK/upstream.tmp"
  mkdir -p "$WORK/upstream.tmp/shim"
  cp "$HERE/_shim/shim.go" "$WORK/upstream.tmp/shim/shim.go"
  echo "$marker" >"$WORK/upstream.tmp/.svl-source"
  mv "$WORK/upstream.tmp" "$WORK/upstream"
fi
ln -sfn "$WORK/upstream" "$HERE/_upstream"   # go.mod: replace ... => ./_upstream

say "building the schema generator (cold: 10-20 min on 2 cores; logs in $LOGS)"
# The plugin embeds schema.json; a placeholder lets the package list load before it exists.
[ -s "$HERE/cmd/pulumi-resource-docker/schema.json" ] || echo '{}' >"$HERE/cmd/pulumi-resource-docker/schema.json"
run_go tfgen go build -v -mod=mod -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" \
  -o "$WORK/bin/pulumi-tfgen-docker" ./cmd/pulumi-tfgen-docker

say "generating the Pulumi schema from the bridge mapping"
"$WORK/bin/pulumi-tfgen-docker" "$WORK/schema.json.tmp" 2>"$LOGS/lab-docker-schema.log" \
  || { tail -20 "$LOGS/lab-docker-schema.log" >&2; die "tfgen schema generation"; }
mv "$WORK/schema.json.tmp" "$WORK/schema.json"
cp "$WORK/schema.json" "$HERE/cmd/pulumi-resource-docker/schema.json"

say "checking every property name the pulumi_docker SDK uses exists in that schema"
if [ -x "$PY" ] && "$PY" -c 'import pulumi_docker' 2>/dev/null; then
  rc=0; "$PY" "$HERE/check_mapping.py" "$WORK/schema.json" >"$LOGS/lab-docker-mapping.log" 2>&1 || rc=$?
  grep -v '^  info:' "$LOGS/lab-docker-mapping.log" | sed 's/^/  /'
  [ "$rc" = 0 ] || die "name mapping does not match the pulumi_docker SDK (details: $LOGS/lab-docker-mapping.log)"
elif [ -n "${SKIP_MAPPING_CHECK:-}" ]; then
  echo "  skipped (SKIP_MAPPING_CHECK set)"
else
  die "no python with pulumi_docker at $PY (set PYTHON=..., or SKIP_MAPPING_CHECK=1)"
fi

say "building the plugin"
tmp="$OUT_DIR/.pulumi-resource-docker.tmp.$$"
trap 'rm -f "$tmp"' EXIT
run_go plugin go build -v -mod=mod -trimpath -tags "$TAGS" -ldflags "$LDFLAGS" \
  -o "$tmp" ./cmd/pulumi-resource-docker
got=$("$tmp" -version) || die "the new binary does not start"
[ "$got" = "$VERSION" ] || die "the new binary reports version '$got', expected $VERSION"
cp "$WORK/schema.json" "$OUT_DIR/schema.json"
mv -f "$tmp" "$OUT"
echo "$stamp" >"$OUT_DIR/.stamp"
echo "lab-docker: built $OUT ($(du -h "$OUT" | cut -f1), version $got) -- a LAB STAND-IN, not Pulumi's release"
echo "  install: pulumi plugin install resource docker $VERSION --file $OUT"
