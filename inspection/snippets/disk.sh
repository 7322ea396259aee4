# Free bytes on the filesystem that holds $1 (or its nearest existing parent). Read-only.
p=$1
while [ ! -e "$p" ] && [ "$p" != / ]; do p=$(dirname "$p"); done
df -B1 --output=avail "$p"
