# The HF cache under $1 (the stack's model.cacheDir): per repo its refs, snapshots and the
# bytes in blobs/ (incomplete downloads excluded). Read-only. One tab-separated fact per line.
root=$1
[ -d "$root/hub" ] && root="$root/hub"
[ -d "$root" ] || exit 0
for repo in "$root"/models--*; do
  [ -d "$repo" ] || continue
  printf 'repo\t%s\n' "${repo##*/}"
  if [ -d "$repo/refs" ]; then
    (cd "$repo/refs" && find . -type f | sed 's|^\./||' | while read -r ref; do
      printf 'ref\t%s\t%s\n' "$ref" "$(head -c 64 "$ref" | tr -d '[:space:]')"; done)
  fi
  for snap in "$repo"/snapshots/*; do [ -d "$snap" ] && printf 'snapshot\t%s\n' "${snap##*/}"; done
  bytes=$(find "$repo/blobs" -type f ! -name '*.incomplete' -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {printf "%d", s}')
  printf 'blobs\t%s\n' "${bytes:-0}"
done
