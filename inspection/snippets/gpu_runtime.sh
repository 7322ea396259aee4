# How containers can get the GPU: the NVIDIA container hook/runtime on PATH, CDI specs.
x=$(command -v nvidia-container-runtime-hook) && echo "hook $x"
x=$(command -v nvidia-container-runtime) && echo "hook $x"
for f in /etc/cdi/*nvidia* /var/run/cdi/*nvidia*; do [ -e "$f" ] && echo "cdi $f"; done
exit 0
