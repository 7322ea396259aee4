# Link speed of interface $1: ethtool's line, else /sys/class/net/$1/speed. Read-only.
out=$(ethtool "$1" 2>/dev/null | grep -i 'speed:')
if [ -n "$out" ]; then echo "$out"; else cat "/sys/class/net/$1/speed"; fi
