# The frame of the recon script (inspection/recon.py adds SV_NONCE and the sections): every
# section runs under `timeout` with stdin from /dev/null and prints
#   === spark-vllm:<nonce>:section:<name> ===  <stdout>
#   === spark-vllm:<nonce>:stderr:<name> ===  <stderr, 2000 bytes>
#   === spark-vllm:<nonce>:end:<name> rc=<exit code> ===
# <nonce> is fresh for every survey (never exported, never on a command line): text a command
# prints (a crafted file name, say) cannot know it, so it cannot forge a section.
# sv_bg sections run concurrently and are printed in start order after `wait`.
export LC_ALL=C
# A private directory or nothing: never a predictable path another user could plant first.
if ! SV_DIR=$(mktemp -d) || [ -z "$SV_DIR" ] || [ ! -d "$SV_DIR" ]; then
  echo "spark-vllm recon: mktemp -d failed; refusing a predictable temporary directory" >&2
  exit 3
fi
SV_N=0
sv_run() {  # <section> <seconds> <command...>
  local name=$1 secs=$2 err="$SV_DIR/err.$BASHPID"; shift 2
  echo "=== spark-vllm:$SV_NONCE:section:$name ==="
  if command -v "$1" >/dev/null 2>&1; then
    timeout -k 2 "$secs" "$@" </dev/null 2>"$err"; rc=$?
  else
    echo "$1: command not found" >"$err"; rc=127
  fi
  echo
  echo "=== spark-vllm:$SV_NONCE:stderr:$name ==="
  [ ! -s "$err" ] || head -c 2000 "$err"  # most sections print no error: no `head` for them
  echo
  echo "=== spark-vllm:$SV_NONCE:end:$name rc=$rc ==="
}
sv_bg() {  # sv_run in the background; after `wait` the outputs are printed in start order
  SV_N=$((SV_N + 1))
  printf -v SV_OUT %03d "$SV_N"  # not $(printf ...): that forks a subshell per section
  sv_run "$@" >"$SV_DIR/out.$SV_OUT" &
}
