# The labels of every container (docker ps -a), read as JSON: docker ps's Labels column joins
# them with ',' and a label's value may hold one, so a value could pose as another label (an
# image label `description=fast,spark-vllm.managed=true`). One object per container and line:
# {"ID":"<full id>","Labels":{...}} (Labels null when it has none); docker's JSON escapes every
# control character, so a label cannot break the line. Read-only.
export LC_ALL=C
set -f  # the IDs are never expanded against file names
ids=$(docker ps -aq --no-trunc) || exit
[ -n "$ids" ] || exit 0
# shellcheck disable=SC2086  # one argument per ID
exec docker inspect --type container --format '{"ID":{{json .Id}},"Labels":{{json .Config.Labels}}}' $ids
