# Monitoring gate (the head's python3): proves the stack's Prometheus from the head. argv =
# Prometheus's URL (http://127.0.0.1:<port>), a JSON spec {"targets": [{"job": ..., "model" and
# "replica", or "node": ...}], "group": name, "rules": [alert names], "alertmanager": host:port
# (optional)}, timeout in seconds. Waits for /-/ready (and Alertmanager's /-/ready),
# then until /api/v1/targets shows every expected target with health "up" and no other target
# of their jobs (a reload applies a removed target seconds later: Prometheus's discovery sends
# updates at most every 5 s) (each one's state and last error on stderr every 10 s while it
# waits; on timeout it fails naming those not up or not declared), then checks that /api/v1/rules has the group with every rule, and that
# /api/v1/alertmanagers lists the stack's Alertmanager as active. Prints one JSON line. Standard
# library only. API: https://prometheus.io/docs/prometheus/latest/querying/api/
# Built by hostscripts/monitoring.py; the lines above are not sent to the node.

import json, sys, time, urllib.error, urllib.request
url, spec, timeout = sys.argv[1].rstrip("/"), json.loads(sys.argv[2]), int(sys.argv[3])
end = time.time() + timeout
def get(path, base=None):
    with urllib.request.urlopen((base or url) + path, timeout=30) as r:
        return r.status, r.read()
def name(t):
    if "replica" in t:
        return "%s/%s@%s" % (t["job"], t.get("model", "?"), t["replica"])
    return "/".join([t["job"]] + [v for k, v in sorted(t.items()) if k != "job"])
def ready(what, base):
    last = ""
    while True:
        try:
            if get("/-/ready", base)[0] == 200:
                return
            last = "not ready"
        except urllib.error.HTTPError as e:
            last = "HTTP %d" % e.code
        except Exception as e:
            last = repr(e)
        if time.time() > end:
            sys.exit("%s at %s not ready within %ds: %s" % (what, base, timeout, last))
        time.sleep(1)
am = spec.get("alertmanager")
ready("prometheus", url)
if am:
    ready("alertmanager", "http://" + am)
def states():
    active = json.loads(get("/api/v1/targets?state=active")[1])["data"]["activeTargets"]
    found = {}
    for t in spec["targets"]:
        for a in active:
            if all(a["labels"].get(k) == v for k, v in t.items()):
                found[name(t)] = (a.get("health", "unknown"), a.get("lastError", ""))
                break
        else:
            found[name(t)] = ("missing", "not among Prometheus's active targets")
    jobs = set(t["job"] for t in spec["targets"])
    for a in active:
        labels = a["labels"]
        if labels.get("job") in jobs and not any(
                all(labels.get(k) == v for k, v in t.items()) for t in spec["targets"]):
            extra = {"job": labels["job"]}
            for k in ("model", "replica", "node"):
                if k in labels:
                    extra[k] = labels[k]
            found[name(extra)] = ("undeclared", "still scraped: the configuration that drops "
                                  "it is not applied yet")
    return found
said = 0.0
while True:
    try:
        seen = states()
    except Exception as e:
        seen = {name(t): ("unknown", "the targets API: %r" % e) for t in spec["targets"]}
    down = {n: s for n, s in seen.items() if s[0] != "up"}
    if not down:
        break
    if time.time() > end:
        sys.exit("targets not up after %ds: %s" % (timeout, "; ".join(
            "%s %s (%s)" % (n, h, err or "no error yet") for n, (h, err) in sorted(down.items()))))
    if time.time() - said >= 10:
        said = time.time()
        for n, (h, err) in sorted(seen.items()):
            print("monitoring gate: %s %s%s" % (n, h, " (%s)" % err if err else ""),
                  file=sys.stderr, flush=True)
    time.sleep(1)
groups = json.loads(get("/api/v1/rules")[1])["data"]["groups"]
group = [g for g in groups if g.get("name") == spec["group"]]
if not group:
    sys.exit("prometheus has no rule group %s (its groups: %s)"
             % (spec["group"], ", ".join(g.get("name", "?") for g in groups) or "none"))
have = [r.get("name") for r in group[0].get("rules", [])]
missing = [r for r in spec["rules"] if r not in have]
if missing:
    sys.exit("prometheus's rule group %s lacks %s (it has: %s)"
             % (spec["group"], ", ".join(missing), ", ".join(have) or "none"))
out = {"ready": True, "targets": sorted(seen), "group": spec["group"], "rules": have}
if am:
    while True:
        try:
            active = json.loads(get("/api/v1/alertmanagers")[1])["data"]["activeAlertmanagers"]
            urls = [a.get("url", "") for a in active]
        except Exception as e:
            urls = ["(the alertmanagers API: %r)" % e]
        if any(u.startswith("http://%s/" % am) for u in urls):
            break
        if time.time() > end:
            sys.exit("prometheus does not send to alertmanager %s (its alertmanagers: %s)"
                     % (am, ", ".join(urls) or "none"))
        time.sleep(1)
    out["alertmanager"] = am
print(json.dumps(out, sort_keys=True))
