# The labels of every container (docker ps -a), read as JSON: docker ps's Labels column joins
# them with ',' and a value may hold one, so a value could pose as another label (an image label
# `description=fast,spark-vllm.managed=true`). One object per container and line:
# {"ID":"<full id>","Image":"sha256:<image id>","Labels":{...}} (Labels null when it has none),
# then one per image those containers run: {"ImageID":"sha256:<id>","Labels":{...}}. A container
# inherits its image's labels, so an image's own LABEL spark-vllm.managed=true would make a
# foreign container the stack's: the parser counts a container's spark-vllm.* label only when its
# image does not carry it with that value (issue 46). docker's JSON escapes every control
# character, so a label cannot break the line; a label value cannot hold an unescaped quote, so
# `"Image":"sha256:...` is found only where docker put it. Read-only.
export LC_ALL=C
set -f  # the IDs are never expanded against file names
ids=$(docker ps -aq --no-trunc) || exit
[ -n "$ids" ] || exit 0
# shellcheck disable=SC2086  # one argument per ID
rows=$(docker inspect --type container \
  --format '{"ID":{{json .Id}},"Image":{{json .Image}},"Labels":{{json .Config.Labels}}}' $ids) || exit
printf '%s\n' "$rows"
images=$(printf '%s\n' "$rows" | grep -o '"Image":"sha256:[0-9a-f]\{64\}"' | cut -d'"' -f4 | sort -u)
[ -n "$images" ] || exit 0
# shellcheck disable=SC2086  # one argument per image ID
exec docker image inspect --format '{"ImageID":{{json .Id}},"Labels":{{json .Config.Labels}}}' $images
