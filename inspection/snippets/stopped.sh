# Foreign containers a stack stopped (preflight.foreignContainers: stop) leave a marker in $1
# holding the stack's label (hostscripts/foreign.py): "<container>\t<project>/<stack>" per marker.
for f in "$1"/*; do [ -f "$f" ] && printf '%s\t%s\n' "${f##*/}" "$(head -n 1 "$f")"; done
exit 0
