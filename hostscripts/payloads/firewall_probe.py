# The vLLM launcher's first step (hostscripts/firewall.py, probe_launcher): is the stack's
# nftables table loaded on this node? A vLLM container has no CAP_NET_ADMIN (it must not be able
# to change the firewall), so it cannot list the table; the table answers a probe instead: a TCP
# connection to the stack's own loopback address and probe port is rejected with ICMP
# admin-prohibited (EHOSTUNREACH) by the table's first rule, and by nothing else (another
# stack's table rejects its own address only). Without the table the kernel refuses it
# (ECONNREFUSED), a listener there accepts it, a drop lets it time out: each exits 1 with why,
# so vLLM never starts on a node whose firewall is not loaded (a manual `docker start` after a
# reboot that skipped the stack's unit, say). argv = address:port. Built by
# hostscripts/firewall.py; the lines above are not sent to the node.

import errno, socket, sys
host, _, port_text = sys.argv[1].rpartition(":")
port = int(port_text)
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(5)
try:
    s.connect((host, port))
    why = "something accepted the connection"
except OSError as e:
    if e.errno in (errno.EHOSTUNREACH, errno.EACCES):
        sys.exit(0)
    why = errno.errorcode.get(e.errno, str(e)) if e.errno else "no answer (timed out)"
finally:
    s.close()
print(f"spark-vllm: the stack's firewall is not loaded on this node (its probe {host}:{port} "
      f"answered {why}, not the table's reject): vLLM does not start without it. Run the "
      "stack's `pulumi up`, or start its unit spark-vllm-<stack>-firewall.service",
      file=sys.stderr, flush=True)
sys.exit(1)
