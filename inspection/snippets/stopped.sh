# Foreign containers a stack stopped (preflight.foreignContainers: stop) leave a marker in $1
# holding the stack's label (hostscripts/foreign.py): "marker\t<container>\t<project>/<stack>"
# per marker. A file name or label that is not printable ASCII is never printed raw (it could
# forge a marker line): "skip\t<the file name in printf %q form>" instead.
export LC_ALL=C
printable() { case $1 in '' | *[![:print:]]*) return 1 ;; esac; }
for f in "$1"/*; do
  [ -f "$f" ] || continue
  name=${f##*/}
  printable "$name" || { printf 'skip\t%q\n' "$name"; continue; }
  label=$(head -n 1 -- "$f")
  printable "$label" || { printf 'skip\t%q\n' "$name"; continue; }
  printf 'marker\t%s\t%s\n' "$name" "$label"
done
exit 0
