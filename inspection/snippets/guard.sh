# What the node's guard (hostscripts/guard.py) finds: the tools it needs, the killers' state,
# the guard's folder, and the stack's drop-ins ($2...; $1 is the guard's folder). One record per
# line, tab-separated (inspection/parsers.py parse_guard):
#   tool <name> <path | absent>        earlyoom, systemctl, apt-get, systemd-oomd
#   active <unit> <systemctl is-active's answer | unknown>
#   records <present | absent>         the folder and its hook
#   file <sha256 | absent> <path>      each of the stack's drop-ins
# The paths are the stack's own (hostscripts/guard.py), printable by construction.
export LC_ALL=C
for t in earlyoom systemctl apt-get; do
  p=$(command -v "$t" 2>/dev/null) || p=absent
  printf 'tool\t%s\t%s\n' "$t" "$p"
done
p=absent
for f in /usr/lib/systemd/systemd-oomd /lib/systemd/systemd-oomd; do
  if [ -x "$f" ]; then p=$f; break; fi
done
printf 'tool\tsystemd-oomd\t%s\n' "$p"
for u in earlyoom.service systemd-oomd.service; do
  a=unknown
  if command -v systemctl >/dev/null 2>&1; then
    a=$(systemctl is-active "$u" 2>/dev/null | head -n 1)
    case $a in '' | *[![:alnum:]-]*) a=unknown ;; esac
  fi
  printf 'active\t%s\t%s\n' "$u" "$a"
done
if [ -d "$1" ] && [ -x "$1/earlyoom-kill" ]; then
  printf 'records\tpresent\n'
else
  printf 'records\tabsent\n'
fi
shift
for f in "$@"; do
  if [ -e "$f" ]; then
    d=$(sha256sum -- "$f" | cut -d' ' -f1)
    printf 'file\t%s\t%s\n' "${d:-absent}" "$f"
  else
    printf 'file\tabsent\t%s\n' "$f"
  fi
done
exit 0
