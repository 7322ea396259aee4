# Model ref (the head's own python3, after the hub download): `<cache>/hub/<repo dir>/refs/<revision>`
# holds the commit the revision resolved to, as huggingface_hub keeps it, so the snapshot is
# found by its branch or tag offline too. Written through cache_fs.py's Tree (joined in front of
# this text): a new file renamed over the name, every component opened without following a
# link, so a link planted at the ref (or anywhere on its way) is refused naming it, never
# written through (issue 46: a shell `>` made root truncate the link's target).
# argv = hf-cache-dir repo-dir revision commit, each checked here again (the repo dir's and the
# commit's forms are contract/manifest.py's).
# Prelude: cache_fs, manifest.
# The lines above are not sent to the node.

import os, sys

cache, repo, revision, commit = sys.argv[1:5]
if REPO_DIR.fullmatch(repo) is None or COMMIT.fullmatch(commit) is None \
        or any(ord(c) < 33 or ord(c) == 127 for c in revision) \
        or any(p in ("", ".", "..") for p in revision.split("/")):
    sys.exit("model ref: argv is hf-cache-dir repo-dir revision commit (refused: %r)"
             % (sys.argv[1:5],))
try:
    Tree(os.path.abspath(cache)).write("hub/%s/refs/%s" % (repo, revision), commit.encode())
except Refused as e:
    sys.exit("refused: %s" % e)
print("ref %s -> %s" % (revision, commit))
