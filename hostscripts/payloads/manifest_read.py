# The manifest on stdin, read and refused as a whole before a file is touched (a prelude:
# hostscripts/common.py `payload()` joins this text in front of model_verify.py's and
# model_sync.py's, after contract/manifest.py's rules, which it uses). `read_manifest()` is the
# manifest, or exit 1 with "model manifest refused: <why>; nothing was changed" (issue 31);
# `inside(base, *parts)` is the path the parts name under `base`, checked again where it is
# joined (a value that leaves `base` is refused the same way).
# The lines above are not sent to the node.

import json, os, sys


def refuse_manifest(why):
    sys.exit("model manifest refused: %s; nothing was changed" % why)


def inside(base, *parts):
    path = os.path.normpath(os.path.join(base, *parts))
    if not path.startswith(base + "/"):
        refuse_manifest("%r leaves %s" % ("/".join(parts), base))
    return path


def read_manifest():
    try:
        m = json.load(sys.stdin)
    except ValueError as e:
        refuse_manifest("not JSON (%s)" % e)
    if manifest_problem(m) is not None:
        refuse_manifest(manifest_problem(m))
    return m
