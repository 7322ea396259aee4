#!/usr/bin/env bash
# Build the LAB STAND-IN command plugin (see README.md) into the shared toolchain cache.
#
#   lab/providers/command/build.sh            build if missing or out of date, print the path
#   FORCE=1 lab/providers/command/build.sh    rebuild
#
# Idempotent: the binary is rebuilt only when its sources, go.mod/go.sum or the Go version
# changed (a stamp beside it records a hash of them). The build writes to a temporary file
# in the same folder and renames it, so the final path never holds a half-built binary.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${SPARK_VLLM_CACHE:-$HOME/.cache/spark-vllm}"
VERSION="${LAB_COMMAND_VERSION:-1.2.1}"
OUT_DIR="${LAB_COMMAND_OUT_DIR:-$CACHE/toolchain/lab-plugins/command-$VERSION}"
OUT="$OUT_DIR/pulumi-resource-command"
STAMP="$OUT.stamp"

export GOMODCACHE="$CACHE/go/mod" GOCACHE="$CACHE/go/build"
export GOTOOLCHAIN="${GOTOOLCHAIN:-local}" CGO_ENABLED=0 GOFLAGS="-mod=readonly"

log() { printf '[lab-command] %s\n' "$*" >&2; }

command -v go >/dev/null || { log "go is not on PATH (the toolchain script installs it)"; exit 1; }

# What the binary depends on: every Go source, the module files, the Go version, the version label.
fingerprint() {
  {
    go version
    echo "version=$VERSION"
    cd "$here" && find . -name '*.go' -not -path './testdata/*' -print0 | sort -z | xargs -0 sha256sum
    sha256sum go.mod go.sum
  } | sha256sum | cut -d' ' -f1
}

want="$(fingerprint)"
if [[ -z "${FORCE:-}" && -x "$OUT" && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  log "up to date: $OUT"
  echo "$OUT"
  exit 0
fi

mkdir -p "$OUT_DIR"
cd "$here"
start=$SECONDS
log "downloading modules (GOMODCACHE=$GOMODCACHE)"
go mod download -x 2>&1 | grep -E '^(# get|go: )' | sed 's/^/[lab-command]   /' >&2 || true
go mod verify >/dev/null

tmp="$(mktemp "$OUT_DIR/.pulumi-resource-command.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
log "compiling (go $(go env GOVERSION), version $VERSION) -> $OUT; progress: one line per package built"
# -v prints each package as it is compiled, which is the progress shown.
go build -v -trimpath \
  -ldflags "-s -w -X spark-vllm/lab/command/provider.Version=$VERSION" \
  -o "$tmp" . 2>&1 | sed -u 's/^/[lab-command]   /' >&2
test "${PIPESTATUS[0]}" -eq 0
chmod 0755 "$tmp"
mv -f "$tmp" "$OUT"
trap - EXIT
echo "$want" >"$STAMP"
log "built in $((SECONDS - start))s: $OUT ($(du -h "$OUT" | cut -f1))"
echo "$OUT"
