# The HF cache under $1 (the stack's model.cacheDir): per repo its refs, snapshots and the
# bytes in blobs/ (incomplete downloads excluded); for the repos named after $2 (folder names,
# models--<org>--<name>: the stack's), `listed` and every file each snapshot holds with its size
# (through its links: a link whose blob is gone is no file), so a snapshot short of a file is
# seen whatever other blobs fill the folder; and, when the stack verified the repo
# (hostscripts/payloads/model_verify.py records "<etag> <size> <mtime s.ns>" per blob in
# $2/verified-<repo dir>, $2 the stack's own root-only folder, "" when no stack is known), how
# many recorded blobs are gone or changed size or mtime since: a blob corrupted after the check
# is found here and repaired by the next `up`. Read-only. One tab-separated fact per line.
# A name (or ref content) that is not printable ASCII (a newline, tab, CR, escape sequence, any
# other control character or a non-ASCII byte) is never printed raw: it could add or change
# records. Its folder or file is left out and reported as `skip\t<the name in printf %q form>`.
export LC_ALL=C
printable() { case $1 in '' | *[![:print:]]*) return 1 ;; esac; }
skip() { printf 'skip\t%q\n' "$1"; }
base=$1
records=$2
shift $(( $# < 2 ? $# : 2 ))
listed=" $* "
root=$base
[ -d "$root/hub" ] && root="$root/hub"
[ -d "$root" ] || exit 0
for repo in "$root"/models--*; do
  [ -d "$repo" ] || continue
  name=${repo##*/}
  printable "$name" || { skip "$name"; continue; }
  printf 'repo\t%s\n' "$name"
  case $listed in *" $name "*) lists=1; printf 'listed\n' ;; *) lists=0 ;; esac
  if [ -d "$repo/refs" ]; then
    (cd "$repo/refs" && find . -type f -print0 | while IFS= read -r -d '' ref; do
      ref=${ref#./}
      printable "$ref" || { skip "$ref"; continue; }
      value=$(head -c 64 -- "$ref" | tr -d '[:space:]')
      [ -z "$value" ] || printable "$value" || { skip "$ref"; continue; }
      printf 'ref\t%s\t%s\n' "$ref" "$value"; done)
  fi
  for snap in "$repo"/snapshots/*; do
    [ -d "$snap" ] || continue
    commit=${snap##*/}
    printable "$commit" || { skip "$commit"; continue; }
    printf 'snapshot\t%s\n' "$commit"
    [ "$lists" = 1 ] || continue
    (cd "$snap" && find -L . -type f -printf '%P\t%s\0' 2>/dev/null) |
      while IFS= read -r -d '' entry; do
        path=${entry%$'\t'*}
        printable "$path" || { skip "$path"; continue; }
        printf 'file\t%s\t%s\t%s\n' "$commit" "$path" "${entry##*$'\t'}"
      done
  done
  bytes=$(find "$repo/blobs" -type f ! -name '*.incomplete' -printf '%s\n' 2>/dev/null | awk '{s+=$1} END {printf "%d", s}')
  printf 'blobs\t%s\n' "${bytes:-0}"
  record="$records/verified-$name"
  if [ -n "$records" ] && [ -f "$record" ]; then
    changed=0
    while read -r etag size mtime; do
      case $etag in '' | *[!0-9a-f]*) continue ;; esac
      now=$(stat -c '%s %.9Y' -- "$repo/blobs/$etag" 2>/dev/null) || now=gone
      [ "$now" = "$size $mtime" ] || changed=$((changed + 1))
    done < "$record"
    printf 'changed\t%s\n' "$changed"
  fi
done
