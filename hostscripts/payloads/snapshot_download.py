# Download one model snapshot into the HF cache with huggingface_hub (the serving image's
# python, on the head). argv = repo commit; the HF token, if any, arrives on stdin.
# Built into a command by hostscripts/models.py; the lines above are not sent to the node.

import sys
from huggingface_hub import snapshot_download
token = sys.stdin.read().strip() or None
print(snapshot_download(repo_id=sys.argv[1], revision=sys.argv[2], token=token))
