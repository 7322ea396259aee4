# The memory each running container uses, read from its cgroup's own counters: what
# `docker stats` shows as MEM USAGE (usage minus the inactive page cache), without the ~2 s
# `docker stats --no-stream` spends sampling. $1: where the cgroup filesystem is mounted
# (/sys/fs/cgroup). One line per running container (parse_container_memory in
# inspection/parsers.py subtracts, never below 0):
#   <id> v2 <memory.current> <inactive_file of memory.stat>
#   <id> v1 <memory.usage_in_bytes> <total_inactive_file of memory.stat>
#   <id> unavailable <why>
# The cgroup is the directory named after the container's full ID, at most 5 levels below the
# memory hierarchy's root: docker-<id>.scope (systemd driver) or <id> (cgroupfs driver), under
# any cgroup parent. One `find` for all containers; bash reads the counters. Nothing read from a
# file is printed unless it is a number; an ID that is not 64 hex digits is printed as
# "skip\t<%q form>". Read-only.
export LC_ALL=C
set -f  # nothing here is a glob: an ID is never expanded against file names
ids=$(docker ps -q --no-trunc) || exit
root=${1:-/sys/fs/cgroup}
if [ -f "$root/cgroup.controllers" ]; then
  tree=$root version=v2 usage=memory.current inactive=inactive_file
elif [ -f "$root/memory/memory.stat" ]; then
  tree=$root/memory version=v1 usage=memory.usage_in_bytes inactive=total_inactive_file
else
  tree=
fi
want=()
names=()
for id in $ids; do
  case $id in
    *[!0-9a-f]*) printf 'skip\t%q\n' "$id"; continue ;;
  esac
  [ ${#id} -eq 64 ] || { printf 'skip\t%q\n' "$id"; continue; }
  want+=("$id")
  names+=(-o -name "*$id*")
done
[ ${#want[@]} -gt 0 ] || exit 0
declare -A dir=()
if [ -n "$tree" ]; then
  while IFS= read -r -d '' d; do
    base=${d##*/}
    for id in "${want[@]}"; do
      case $base in *"$id"*) [ -n "${dir[$id]-}" ] || dir[$id]=$d ;; esac
    done
  done < <(find "$tree" -mindepth 1 -maxdepth 5 -type d \( "${names[@]:1}" \) -prune -print0)
fi
for id in "${want[@]}"; do
  if [ -z "$tree" ]; then
    echo "$id unavailable no memory cgroup hierarchy (neither cgroup v2 nor v1 memory)"
    continue
  fi
  d=${dir[$id]-}
  if [ -z "$d" ]; then
    echo "$id unavailable no cgroup directory named after it"
    continue
  fi
  cur='' ina=''
  if [ ! -r "$d/$usage" ]; then
    echo "$id unavailable $usage unreadable"
    continue
  fi
  read -r cur 2>/dev/null < "$d/$usage"
  case $cur in
    '' | *[!0-9]*) echo "$id unavailable $usage is not a number"; continue ;;
  esac
  if [ ! -r "$d/memory.stat" ]; then
    echo "$id unavailable memory.stat unreadable"
    continue
  fi
  while read -r key value; do
    [ "$key" = "$inactive" ] && { ina=$value; break; }
  done 2>/dev/null < "$d/memory.stat"
  case $ina in
    '') echo "$id unavailable no $inactive in memory.stat"; continue ;;
    *[!0-9]*) echo "$id unavailable $inactive is not a number"; continue ;;
  esac
  echo "$id $version $cur $ina"
done
exit 0
