# Is the stack's own `vllm serve` alive inside each running Ray head container? $1 is the pid
# file hostscripts/vllm.py writes in the container. One line per head: "<name> running|stopped".
# A name that is not a docker container name is never printed raw: "skip\t<%q form>".
export LC_ALL=C
docker ps --filter label=spark-vllm.managed=true --filter label=spark-vllm.role=ray-head --format '{{.Names}}' |
while IFS= read -r c; do
  case $c in
    '') continue ;;
    [!A-Za-z0-9]* | *[!A-Za-z0-9_.-]*) printf 'skip\t%q\n' "$c"; continue ;;
  esac
  if docker exec "$c" sh -c "kill -0 \$(cat $1) 2>/dev/null" </dev/null; then echo "$c running"; else echo "$c stopped"; fi
done
exit 0
