# Image verify (a node's own python3, image.source = head): the `docker save` archive the node
# fetched from the head's seeder into a root-only scratch file, checked BEFORE `docker load`
# sees it (issue 46: the stream was piped into `docker load` and its image ID compared after, so
# a forged stream had already retagged other images by then; the node never authenticates the
# seeder). The archive must describe exactly the image the head has, named only as `ref`:
#
# * a plain tar: every member a regular file, a folder or a relative link that stays in the
#   archive, no name twice (docker load extracts it all and a later copy would win), no
#   absolute or `..` name;
# * `manifest.json` (what docker load reads, moby image/tarexport/load.go): exactly one image,
#   its Config a file whose sha256 is the head's image ID (the classic store's ID; docker
#   checks every layer against the config's diff_ids itself), RepoTags none or only `ref`, no
#   LayerSources (layers fetched from elsewhere);
# * `index.json` (the OCI index Docker 25+ writes, what the containerd image store loads):
#   none, or one manifest whose blob's sha256 is its digest and whose names are only `ref`'s;
#   with the containerd store the image ID is that manifest's digest, and that is accepted too;
# * `repositories` (the legacy tags): none, or only `ref`.
# Anything else: exit 1 with "image archive refused: ..." and nothing loaded.
# argv = archive ref image-id. Prints "image archive verified: <id>". Built into the copy by
# hostscripts/images.py; the lines above are not sent to the node.

import hashlib, json, posixpath, re, sys, tarfile

path, ref, want = sys.argv[1:4]


def refuse(why):
    sys.exit("image archive refused: %s; nothing was loaded" % why)


if not re.fullmatch(r"sha256:[0-9a-f]{64}", want):
    refuse("the image ID %r is not sha256:<64 hex>" % want)


def names_of(ref):
    """What `ref` may be called in the archive: Docker's familiar and full names with its tag
    (`latest` when it names none), none when it is pinned by digest (docker save then tags
    nothing). Returns (full names, tag)."""
    if "@" in ref:
        return set(), None
    name, tag = ref, "latest"
    last = ref.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = ref.rsplit(":", 1)
    first = name.split("/", 1)[0]
    full = name
    if "/" not in name or not ("." in first or ":" in first or first == "localhost"):
        full = "docker.io/" + (name if "/" in name else "library/" + name)
    return {"%s:%s" % (name, tag), "%s:%s" % (full, tag)}, tag


allowed, tag = names_of(ref)
try:
    archive = tarfile.open(path, "r:")
except (OSError, tarfile.TarError) as e:
    refuse("not a tar archive (%s)" % e)
members = {}
with archive:
    for m in archive:
        name = posixpath.normpath(m.name)
        if m.name.startswith("/") or name == ".." or name.startswith("../"):
            refuse("%r is outside the archive" % m.name)
        if name in members:
            refuse("%r is in it twice" % m.name)
        if not (m.isreg() or m.isdir() or m.issym()):
            refuse("%r is neither a file, a folder nor a link" % m.name)
        if m.issym():
            target = posixpath.normpath(posixpath.join(posixpath.dirname(name), m.linkname))
            if m.linkname.startswith("/") or target == ".." or target.startswith("../"):
                refuse("the link %r leaves the archive" % m.name)
        members[name] = m

    def member(name, hops=0):
        m = members.get(posixpath.normpath(name))
        if m is None or hops > 8:
            refuse("%r is not in the archive" % name)
        if m.issym():
            return member(posixpath.join(posixpath.dirname(m.name), m.linkname), hops + 1)
        if not m.isreg():
            refuse("%r is not a file" % name)
        return m

    def read(name, limit=1 << 26):
        m = member(name)
        if m.size > limit:
            refuse("%r is larger than %d bytes" % (name, limit))
        return archive.extractfile(m).read()

    def digest(name):
        h = hashlib.sha256()
        with archive.extractfile(member(name)) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        return "sha256:" + h.hexdigest()

    def load(name):
        try:
            return json.loads(read(name))
        except ValueError as e:
            refuse("%s is not JSON (%s)" % (name, e))

    manifest = load("manifest.json")
    if not isinstance(manifest, list) or len(manifest) != 1 or not isinstance(manifest[0], dict):
        refuse("manifest.json does not describe exactly one image")
    entry = manifest[0]
    if not isinstance(entry.get("Config"), str):
        refuse("manifest.json names no config")
    tags = entry.get("RepoTags") or []
    if not isinstance(tags, list) or any(not isinstance(t, str) or t not in allowed for t in tags):
        refuse("manifest.json tags %r, not only %s" % (tags, ref))
    if entry.get("LayerSources"):
        refuse("manifest.json fetches layers from elsewhere (LayerSources)")
    ids = {digest(entry["Config"])}
    if "index.json" in members:
        index = load("index.json")
        found = index.get("manifests") if isinstance(index, dict) else None
        if not isinstance(found, list) or len(found) != 1 or not isinstance(found[0], dict):
            refuse("index.json does not describe exactly one image")
        blob = found[0].get("digest")
        if not isinstance(blob, str) or not re.fullmatch(r"sha256:[0-9a-f]{64}", blob):
            refuse("index.json's manifest digest is not sha256:<64 hex>")
        if digest("blobs/sha256/" + blob[len("sha256:"):]) != blob:
            refuse("index.json's manifest is not the blob its digest names")
        notes = found[0].get("annotations") or {}
        if not isinstance(notes, dict):
            refuse("index.json's annotations are not a mapping")
        for key in ("io.containerd.image.name", "org.opencontainers.image.ref.name"):
            value = notes.get(key)
            if value is not None and value not in allowed and value != tag:
                refuse("index.json names %r (%s), not %s" % (value, key, ref))
        ids.add(blob)
    if "repositories" in members:
        repos = load("repositories")
        named = [(r, t) for r, tags_ in (repos.items() if isinstance(repos, dict) else [(None, 0)])
                 for t in (tags_ if isinstance(tags_, dict) else [None])]
        if any(not isinstance(r, str) or "%s:%s" % (r, t) not in allowed for r, t in named):
            refuse("repositories tags %r, not only %s" % (repos, ref))
    if want not in ids:
        refuse("it holds image %s, not %s (the head's)" % (" or ".join(sorted(ids)), want))
print("image archive verified: %s" % want)
