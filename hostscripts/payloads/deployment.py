# A model's verified deployment on one node (issue 49), with the node's python3 and Docker's own
# Engine API on the local socket (DOCKER_HOST when it names a unix socket, else
# /var/run/docker.sock): the docker CLI has no "create a container from an inspected one", and
# the API's create takes back exactly the Config and HostConfig its inspect gives
# (https://docs.docker.com/reference/api/engine/version/v1.43/#tag/Container/operation/ContainerCreate).
# argv = command '<JSON arguments>' [more]; every record is root only (0600, in 0700 folders).
#   gate    after the health gate's probe (argv: the outcome, the probe's output, why it failed,
#           the log tail): writes verdict.json; on a failure with `restore` puts the recorded
#           containers of this node back (restore below); prints one JSON line, exits 0.
#   record  the node's containers of the model as they run now (inspect, and the files the stack
#           uploaded into them) into containers.json, under the deployment's id.
#   restore every recorded container whose running one is not the recorded one (another ID, or
#           none) recreated from the record: the current one stopped and removed, created with
#           the recorded Config and HostConfig (a PidMode that named a recreated container now
#           names its new ID; label spark-vllm.restored=<restore id>), its files put back,
#           started. Refused (nothing changed) when the record is not the expected deployment or
#           holds other containers than the node has now.
#   final   on the node of the model's API: after a pass, the record and the summary
#           (verified.json) printed as JSON; after a failure, the new version's failure (why and
#           log tail) on stderr, and exit 2 when the deployment was put back (the caller waits for
#           it to answer), else 1.
#   restored after the put-back deployment answered: the line that says so (stderr), exit 1.
#   status  `spark-vllm status`: the summary and whether the running container is it.
# Built by hostscripts/deployment.py; the lines above are not sent to the node.

import base64, datetime, http.client, io, json, os, re, secrets, socket, sys, tarfile, time
import urllib.parse

HEX16 = re.compile(r"[0-9a-f]{16}")
SKIP_ON_HOST_NET = ("Hostname", "Domainname")
RESTORED, AFTER = "spark-vllm.restored", "spark-vllm.after-restore"


class ApiError(Exception):
    pass


class Unix(http.client.HTTPConnection):
    def __init__(self, path, timeout):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


def socket_path():
    host = os.environ.get("DOCKER_HOST", "")
    if not host:
        return "/var/run/docker.sock"
    if host.startswith("unix://"):
        return host[len("unix://"):]
    raise ApiError("DOCKER_HOST=%s is not a unix socket: the deployment needs the local "
                   "Docker Engine API" % host)


def api(method, path, body=None, raw=None, ctype="application/json", timeout=120):
    """(status, bytes) of one Engine API call; a status >= 400 other than 404 raises."""
    conn = Unix(socket_path(), timeout)
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    try:
        conn.request(method, path, body=data, headers={"Content-Type": ctype} if data else {})
        r = conn.getresponse()
        out = r.read()
    except OSError as e:
        raise ApiError("%s %s: %s" % (method, path.split("?")[0], e)) from None
    finally:
        conn.close()
    if r.status >= 400 and r.status != 404:
        try:
            msg = json.loads(out).get("message", "")
        except ValueError:
            msg = out[:300].decode("utf-8", "replace")
        raise ApiError("%s %s: %d %s" % (method, path.split("?")[0], r.status, msg))
    return r.status, out


def quote(text):
    """A container name or an image ID (`sha256:<hex>`) as one path segment."""
    return urllib.parse.quote(text, safe=":")


def inspect(name):
    status, out = api("GET", "/containers/%s/json" % quote(name))
    return None if status == 404 else json.loads(out)


def read_file(cid, path):
    status, out = api("GET", "/containers/%s/archive?path=%s" % (cid, quote(path)))
    if status == 404:
        raise ApiError("%s is not in the container" % path)
    with tarfile.open(fileobj=io.BytesIO(out)) as tar:
        member = tar.next()
        f = tar.extractfile(member) if member is not None else None
        if f is None:
            raise ApiError("%s is not a file in the container" % path)
        return {"data": base64.b64encode(f.read()).decode(), "mode": member.mode}


def put_files(cid, files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for path, f in sorted(files.items()):
            data = base64.b64decode(f["data"])
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), f.get("mode", 0o644), int(time.time())
            tar.addfile(info, io.BytesIO(data))
    api("PUT", "/containers/%s/archive?path=/" % cid, raw=buf.getvalue(),
        ctype="application/x-tar")


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def load(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(path, value):
    os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
    os.chmod(os.path.dirname(path), 0o700)
    tmp = path + ".new"
    if os.path.lexists(tmp):
        os.remove(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(value, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)


def record(a, deployment):
    """containers.json: the model's containers on this node as they run, in start order."""
    out = []
    for c in a["containers"]:
        info = inspect(c["name"])
        if info is None:
            raise ApiError("%s is gone: nothing to record" % c["name"])
        files = {p: read_file(info["Id"], p) for p in c.get("files", [])}
        out.append({"name": c["name"], "id": info["Id"], "config": info["Config"],
                    "hostConfig": info["HostConfig"], "files": files})
    rec = {"deployment": deployment, "at": now(), "containers": out}
    save(os.path.join(a["dir"], "containers.json"), rec)
    return rec


def create_body(c, moved, rid):
    """The create request for a recorded container: its Config with HostConfig, the restore's
    label, a PidMode or IpcMode that named a recreated container naming its new ID."""
    body = dict(c["config"])
    host = dict(c["hostConfig"])
    for key in ("PidMode", "IpcMode", "NetworkMode"):
        mode = host.get(key) or ""
        if mode.startswith("container:") and mode[len("container:"):] in moved:
            host[key] = "container:" + moved[mode[len("container:"):]]
    net = host.get("NetworkMode") or ""
    if net == "host" or net.startswith("container:"):
        for key in SKIP_ON_HOST_NET:
            body.pop(key, None)
    labels = {k: v for k, v in (body.get("Labels") or {}).items() if k not in (RESTORED, AFTER)}
    labels[RESTORED] = rid
    body["Labels"] = labels
    body["HostConfig"] = host
    return body


def restore(a, expect, rid):
    """-> {"restored": [...], "kept": [...]} or {"notRestored": why}: see the header."""
    rec = load(os.path.join(a["dir"], "containers.json"))
    if rec is None:
        return {"notRestored": "no verified deployment is recorded on this node"}
    if expect and rec.get("deployment") != expect:
        return {"notRestored": "this node's record is deployment %s, not %s (the head's)"
                % (rec.get("deployment"), expect)}
    names = [c["name"] for c in a["containers"]]
    recorded = [c["name"] for c in rec["containers"]]
    if recorded != names:
        return {"notRestored": "the verified deployment ran %s here, this one %s"
                % (", ".join(recorded) or "nothing", ", ".join(names) or "nothing")}
    done, kept, moved = [], [], {}
    for c in rec["containers"]:
        cur = inspect(c["name"])
        if cur is not None and cur["Id"] == c["id"]:
            kept.append(c["name"])
            continue
        try:
            if cur is not None:
                api("POST", "/containers/%s/stop?t=10" % cur["Id"], timeout=60)
                api("DELETE", "/containers/%s?force=true" % cur["Id"])
            status, out = api("POST", "/containers/create?name=%s" % quote(c["name"]),
                              body=create_body(c, moved, rid))
            new = json.loads(out)["Id"]
            if c["files"]:
                put_files(new, c["files"])
            api("POST", "/containers/%s/start" % new)
        except ApiError as e:
            save(os.path.join(a["dir"], "containers.json"), rec)
            return {"notRestored": "%s could not be put back: %s" % (c["name"], e),
                    "restored": done}
        moved[c["id"]] = new
        c["id"] = new
        done.append(c["name"])
    rec["restored"] = {"id": rid, "at": now(), "containers": done}
    save(os.path.join(a["dir"], "containers.json"), rec)
    return {"deployment": rec["deployment"], "restore": rid, "restored": done, "kept": kept}


def shape(value):
    if not isinstance(value, dict):
        return "(unknown)"
    return "; ".join("%s: %s" % (n, ", ".join(c)) for n, c in sorted(value.items()))


def read_text(path, limit=20000):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-limit:]
    except OSError:
        return ""


ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b: |\bERROR\b")
TAIL_LINES, ERROR_LINES = 30, 20


def log_excerpt(text):
    """vLLM's log as the failure shows it: the error lines of everything before its last
    TAIL_LINES lines (at most ERROR_LINES, the latest; each once), then those last lines. The
    last lines of a vLLM that fails while it loads are the API server's traceback ending in
    "See root cause above"; the root cause (a rank's exception) is the error line above it."""
    lines = text.splitlines()
    before, tail = lines[:-TAIL_LINES], lines[-TAIL_LINES:]
    seen, errors = set(), []
    for ln in reversed(before):
        if ERROR_LINE.search(ln) and ln.strip() not in seen:
            seen.add(ln.strip())
            errors.append(ln)
            if len(errors) == ERROR_LINES:
                break
    errors.reverse()
    out = errors + (["[...]"] if errors and len(before) > len(errors) else []) + tail
    return "\n".join(out) + ("\n" if out else "")


def gate(a, outcome, probe_file, why, tail_file):
    d = a["dir"]
    if outcome == "ok":
        lines = [ln for ln in read_text(probe_file).splitlines() if ln.strip()]
        probe = json.loads(lines[-1])
        verdict = dict(probe, deployment=secrets.token_hex(8), at=now())
        save(os.path.join(d, "verdict.json"), verdict)
        print(json.dumps(verdict, sort_keys=True))
        return
    verdict = {"health": "failed", "why": why.strip() or "the gate failed", "at": now(),
               "log": log_excerpt(read_text(tail_file, 400000)), "probe": read_text(probe_file, 4000)}
    r = a.get("restore")
    if not isinstance(r, dict):
        verdict["notRestored"] = "health.onFailure is keep: the failing version stays"
    else:
        summary = load(os.path.join(d, "verified.json"))
        rec = load(os.path.join(d, "containers.json"))
        if summary is None or rec is None:
            verdict["notRestored"] = "no verified deployment is recorded on this node"
        elif summary.get("shape") != r.get("shape"):
            verdict["notRestored"] = ("the last verified deployment ran %s, this one %s: "
                                      "nothing of this shape was verified"
                                      % (shape(summary.get("shape")), shape(r.get("shape"))))
        else:
            verdict["restoreStarted"] = time.time()
            try:
                result = restore(a, summary.get("deployment"), secrets.token_hex(8))
            except ApiError as e:
                result = {"notRestored": "could not be put back: %s" % e}
            if not result.get("notRestored") and a["api"] not in result.get("restored", []):
                result["notRestored"] = ("%s is the verified container itself: nothing to put "
                                         "back" % a["api"])
            if result.get("notRestored"):
                verdict["notRestored"] = result.pop("notRestored")
            verdict["restore"] = result
    save(os.path.join(d, "verdict.json"), verdict)
    print(json.dumps({k: v for k, v in verdict.items() if k not in ("log", "probe")},
                     sort_keys=True))


def summary(a, rec, verdict):
    """verified.json: what the deployment is, read from its API container and the program."""
    api_c = inspect(a["container"])
    if api_c is None:
        raise ApiError("%s is gone" % a["container"])
    _, out = api("GET", "/images/%s/json" % quote(api_c["Image"]))
    image = json.loads(out)
    facts = a["facts"]
    env = sorted(e for e in api_c["Config"].get("Env") or [] if e.startswith("VLLM_"))
    return {
        "deployment": rec["deployment"], "verifiedAt": rec["at"],
        "image": {"ref": facts.get("image"), "id": api_c["Image"],
                  "repoDigests": sorted(image.get("RepoDigests") or [])},
        "model": facts.get("model"), "drafter": facts.get("drafter"),
        "servedModelName": facts.get("servedModelName"), "nodes": facts.get("nodes"),
        "shape": facts.get("shape"),
        "container": a["container"], "argv": api_c["Config"].get("Cmd") or [],
        "env": dict(e.split("=", 1) for e in env),
        "gate": {k: verdict.get(k) for k in ("seconds", "smokeSeconds", "at")},
    }


def describe(s):
    model = s.get("model") or {}
    image = (s.get("image") or {}).get("id") or "?"
    return "%s, verified %s: image %s, %s@%s" % (
        s.get("deployment"), s.get("verifiedAt"), image[:19], model.get("repo"),
        (model.get("commit") or "?")[:12])


def final(a):
    d = a["dir"]
    verdict = load(os.path.join(d, "verdict.json")) or {}
    if a["mode"] == "ok":
        if verdict.get("deployment") != a["deployment"]:
            sys.exit("the gate's verdict on this node is not deployment %s" % a["deployment"])
        rec = record(a, a["deployment"])
        s = summary(a, rec, verdict)
        save(os.path.join(d, "verified.json"), s)
        print(json.dumps(s, sort_keys=True))
        return 0
    err = sys.stderr
    err.write("the new version failed its health gate: %s\n" % verdict.get("why", "?"))
    if verdict.get("log"):
        err.write("--- vllm serve in %s: its log's error lines, then its last lines ---\n%s\n"
                  % (a["container"], verdict["log"].rstrip("\n")))
    others = a.get("nodes") or {}
    missing = {n: w for n, w in sorted(others.items()) if w not in ("restored", "kept")}
    put_back = (verdict.get("restore") or {}).get("deployment")
    if verdict.get("notRestored") or missing or not put_back:
        why = (verdict.get("notRestored") or "; ".join("%s: %s" % kv for kv in missing.items())
               or "the gate's verdict on this node says nothing was put back")
        err.write("not put back: %s\n" % why)
        here = (verdict.get("restore") or {}).get("restored") or []
        if here or any(w == "restored" for w in others.values()):
            err.write("put back only in part (here: %s; %s): see each node's step above\n" % (
                ", ".join(here) or "nothing",
                ", ".join("%s %s" % kv for kv in sorted(others.items()))))
        return 1
    return 2


def restored(a):
    d = a["dir"]
    verdict = load(os.path.join(d, "verdict.json")) or {}
    s = load(os.path.join(d, "verified.json")) or {}
    took = time.time() - float(verdict.get("restoreStarted") or time.time())
    here = ", ".join((verdict.get("restore") or {}).get("restored") or []) or "nothing"
    s["restoredAt"] = now()
    s["restoredAfter"] = verdict.get("why")
    save(os.path.join(d, "verified.json"), s)
    sys.stderr.write("serving the last verified deployment again (%s; recreated here: %s%s; "
                     "answering %.1f s after the restore began)\n"
                     % (describe(s), here, "".join("; %s: %s" % kv for kv in
                                                   sorted((a.get("nodes") or {}).items())),
                        took))
    return 1


def status(a):
    s = load(os.path.join(a["dir"], "verified.json"))
    cur = inspect(a["container"])
    current = None if cur is None else {
        "id": cur["Id"], "image": cur["Image"], "argv": cur["Config"].get("Cmd") or [],
        "env": dict(e.split("=", 1) for e in sorted(cur["Config"].get("Env") or [])
                    if e.startswith("VLLM_")),
        "restored": (cur["Config"].get("Labels") or {}).get(RESTORED)}
    same = (s is not None and current is not None and current["image"] == s["image"]["id"]
            and current["argv"] == s["argv"] and current["env"] == s["env"])
    print(json.dumps({"verified": s, "current": current, "matches": same}, sort_keys=True))


def main():
    cmd, a = sys.argv[1], json.loads(sys.argv[2])
    try:
        if cmd == "gate":
            gate(a, sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6])
        elif cmd == "record":
            rec = record(a, a["deployment"])
            print(json.dumps({"result": "recorded", "deployment": rec["deployment"]}))
        elif cmd == "restore":
            r = restore(a, a["expect"], a["restore"])
            word = ("not-restored" if r.get("notRestored") else
                    "restored" if r.get("restored") else "kept")
            print(json.dumps(dict(r, result=word), sort_keys=True))
        elif cmd == "final":
            return final(a)
        elif cmd == "restored":
            return restored(a)
        elif cmd == "status":
            status(a)
        else:
            sys.exit("deployment: unknown command %s" % cmd)
    except ApiError as e:
        sys.exit("deployment %s: %s" % (cmd, e))
    return 0


sys.exit(main())
