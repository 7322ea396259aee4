# Is the stack's own `vllm serve` alive inside each running Ray head container? $1 is the pid
# file hostscripts/vllm.py writes in the container. One line per head: "<name> running|stopped".
for c in $(docker ps --filter label=spark-vllm.managed=true --filter label=spark-vllm.role=ray-head --format '{{.Names}}'); do
  if docker exec "$c" sh -c "kill -0 \$(cat $1) 2>/dev/null"; then echo "$c running"; else echo "$c stopped"; fi
done
exit 0
