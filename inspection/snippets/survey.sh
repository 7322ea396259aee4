# The frame of the recon script (inspection/recon.py adds the sections): every section runs
# under `timeout` with stdin from /dev/null and prints
#   === spark-vllm:section:<name> ===  <stdout>  === spark-vllm:stderr:<name> ===  <stderr, 2000 bytes>
#   === spark-vllm:end:<name> rc=<exit code> ===
# sv_bg sections run concurrently and are printed in start order after `wait`.
export LC_ALL=C
SV_DIR=$(mktemp -d 2>/dev/null) || { SV_DIR=/tmp/spark-vllm-recon.$$; mkdir -p "$SV_DIR"; }
SV_N=0
sv_run() {  # <section> <seconds> <command...>
  local name=$1 secs=$2 err="$SV_DIR/err.$BASHPID"; shift 2
  echo "=== spark-vllm:section:$name ==="
  if command -v "$1" >/dev/null 2>&1; then
    timeout -k 2 "$secs" "$@" </dev/null 2>"$err"; rc=$?
  else
    echo "$1: command not found" >"$err"; rc=127
  fi
  echo
  echo "=== spark-vllm:stderr:$name ==="
  head -c 2000 "$err"; echo
  echo "=== spark-vllm:end:$name rc=$rc ==="
}
sv_bg() {  # sv_run in the background; after `wait` the outputs are printed in start order
  SV_N=$((SV_N + 1))
  sv_run "$@" >"$SV_DIR/out.$(printf %03d "$SV_N")" &
}
