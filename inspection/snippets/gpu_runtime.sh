# How containers can get the GPU: the NVIDIA container hook/runtime on PATH, CDI specs. A path
# that is not printable ASCII is never printed raw (it could forge a line): "skip\t<%q form>".
export LC_ALL=C
found() {  # <kind> <path>
  case $2 in '' | *[![:print:]]*) printf 'skip\t%q\n' "$2" ;; *) printf '%s %s\n' "$1" "$2" ;; esac
}
x=$(command -v nvidia-container-runtime-hook) && found hook "$x"
x=$(command -v nvidia-container-runtime) && found hook "$x"
for f in /etc/cdi/*nvidia* /var/run/cdi/*nvidia*; do [ -e "$f" ] && found cdi "$f"; done
exit 0
