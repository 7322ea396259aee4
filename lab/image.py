"""The lab's serving image: built without Docker Hub, pushed to the lab registry.

The rest of the lab uses one function: `ensure_image() -> str`, the image reference BY DIGEST in
the lab registry (10.77.0.1:5000/spark-lab/vllm-spark@sha256:...), building and pushing it first
when the registry does not hold it yet. Everything about how the image is made stays in this
module.

This build: debootstrap minbase bookworm + python3 (cached tar), wheels for real Ray,
huggingface_hub and safetensors fetched once with `pip download` (cached), the vLLM stand-in
(lab/vllm_standin) packed as a wheel, all installed into /opt/venv in a chroot, then
`docker import` on the throw-away build host's dockerd (lab.layout.BUILD, namespace svl-build),
`docker save` (cached) and `docker push`. The image key hashes all inputs, so a changed stand-in
means a new image (and a new digest).
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
import zipfile

from lab.hosts import ensure_host, node_docker, stop_host
from lab.layout import BUILD, CACHE, HERE, IMAGE_REPO, REGISTRY
from lab.registry import image_ref, registry_digest
from lab.util import VERBOSE, die, host_pip, log, progress, run, sha256_file, short_hash, write

SUITE = "bookworm"
DEB_MIRROR = "http://deb.debian.org/debian"
ROOTFS_PKGS = ["python3", "python3-venv", "ca-certificates"]
IMAGE_REQS = ["ray[default]==2.60.0", "huggingface_hub==2.4.0", "safetensors==0.8.0"]
IMAGE_ENV = ["PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
             "VIRTUAL_ENV=/opt/venv", "LANG=C.UTF-8", "HF_HOME=/root/.cache/huggingface"]


def ensure_image() -> str:
    """The lab image's reference by digest in the lab registry; built and pushed when missing."""
    key, rootfs, wheels, whl = image_key()
    tag = key
    dg = registry_digest(tag)
    if dg:
        return image_ref(dg)
    img_tar = os.path.join(CACHE, "images", f"lab-image-{key}.tar")
    name = f"{REGISTRY}/{IMAGE_REPO}:{tag}"
    log("image: starting a build dockerd (namespace svl-build)")
    ensure_host(BUILD, 0, 0, sshd=False)
    dk = node_docker(BUILD)
    try:
        if os.path.exists(img_tar):
            log(f"image: loading cached {img_tar}")
            run([*dk, "load", "-i", img_tar], quiet=True)
        else:
            _import_and_save(dk, key, rootfs, wheels, whl, name, img_tar)
        log(f"image: pushing {name}")
        with progress("docker push"):
            run([*dk, "push", name], quiet=True)
    finally:
        log("image: stopping the build dockerd")
        stop_host(BUILD, 0, keep_data=False)
    dg = registry_digest(tag)
    if not dg:
        die("image push did not land in the registry")
    return image_ref(dg)


def _import_and_save(dk: list, key: str, rootfs: str, wheels: str, whl: str, name: str,
                     img_tar: str) -> None:
    """Build the image's root file system, `docker import` it as `name`, cache `docker save`."""
    work = build_image_tree(key, rootfs, wheels, whl)
    changes = []
    for e in IMAGE_ENV:
        changes += ["-c", f"ENV {e}"]
    changes += ["-c", "WORKDIR /", "-c", 'CMD ["/bin/bash"]',
                "-c", ("LABEL org.opencontainers.image.title=spark-vllm-lab-serving "
                       f"spark-vllm.lab.key={key}")]
    tarp = subprocess.Popen(["tar", "-C", work, "--numeric-owner", "--exclude=./proc/*",
                             "--exclude=./sys/*", "--exclude=./dev/*", "-c", "."],
                            stdout=subprocess.PIPE)
    with progress("docker import"):
        subprocess.run([*dk, "import", *changes, "-", name], stdin=tarp.stdout, check=True,
                       stdout=subprocess.DEVNULL)
    tarp.wait()
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(img_tar), exist_ok=True)
    log(f"image: caching {img_tar}")
    run([*dk, "save", "-o", img_tar + ".tmp", name])
    os.replace(img_tar + ".tmp", img_tar)
    for old in os.listdir(os.path.dirname(img_tar)):  # keep only the current image tarball
        if old.startswith("lab-image-") and old != os.path.basename(img_tar):
            os.unlink(os.path.join(os.path.dirname(img_tar), old))


# --------------------------------------------------------------------------- inputs (cached)
def image_key() -> tuple:
    rootfs = ensure_rootfs_tar()
    wheels = ensure_wheels()
    tmpd = os.path.join(CACHE, "tmp", "standin-wheel")
    shutil.rmtree(tmpd, ignore_errors=True)
    os.makedirs(tmpd)
    whl = standin_wheel(tmpd)
    key = short_hash(os.path.basename(rootfs), os.path.basename(wheels), sha256_file(whl),
                     IMAGE_ENV)
    return key, rootfs, wheels, whl


def standin_wheel(dest_dir: str) -> str:
    """Build the vLLM stand-in wheel (deterministic zip, stdlib only)."""
    src = os.path.join(HERE, "vllm_standin")
    with open(os.path.join(src, "wheel.json")) as f:
        meta = json.load(f)
    name, ver = meta["name"], meta["version"]
    dist = f"{name}-{ver}.dist-info"
    files = []
    pkg_root = os.path.join(src, "src")
    for root, dirs, fnames in os.walk(pkg_root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for fn in sorted(fnames):
            if fn.endswith(".pyc"):
                continue
            full = os.path.join(root, fn)
            with open(full, "rb") as f:
                files.append((os.path.relpath(full, pkg_root), f.read()))
    files.append((f"{dist}/METADATA", (f"Metadata-Version: 2.1\nName: {name}\nVersion: {ver}\n"
                                       f"Summary: {meta['summary']}\n").encode()))
    files.append((f"{dist}/WHEEL", (b"Wheel-Version: 1.0\nGenerator: spark-vllm-lab\n"
                                    b"Root-Is-Purelib: true\nTag: py3-none-any\n")))
    scripts = meta["console_scripts"]
    eps = "[console_scripts]\n" + "".join(f"{k} = {v}\n" for k, v in scripts.items())
    files.append((f"{dist}/entry_points.txt", eps.encode()))
    record = ""
    for path, data in files:
        dg = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{path},sha256={dg},{len(data)}\n"
    record += f"{dist}/RECORD,,\n"
    files.append((f"{dist}/RECORD", record.encode()))
    whl = os.path.join(dest_dir, f"{name}-{ver}-py3-none-any.whl")
    with zipfile.ZipFile(whl, "w", zipfile.ZIP_DEFLATED) as z:
        for path, data in files:
            zi = zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0))
            zi.external_attr = 0o644 << 16
            zi.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(zi, data)
    return whl


def ensure_rootfs_tar() -> str:
    key = short_hash(SUITE, "minbase", ",".join(ROOTFS_PKGS), DEB_MIRROR)
    tar = os.path.join(CACHE, f"rootfs-{SUITE}-minbase-{key}.tar")
    if os.path.exists(tar):
        return tar
    work = os.path.join(CACHE, "tmp", f"rootfs-{key}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(work), exist_ok=True)
    log(f"debootstrap {SUITE} minbase (+{','.join(ROOTFS_PKGS)}) -> {tar} (1-3 min)")
    t0 = time.time()
    # a private mount namespace so debootstrap's /proc mounts never leak to the host
    with progress("debootstrap"):
        run(["unshare", "--mount", "--propagation", "private", "--", "debootstrap",
             "--variant=minbase", f"--include={','.join(ROOTFS_PKGS)}", SUITE, work, DEB_MIRROR],
            quiet=not VERBOSE)
    run(["tar", "-C", work, "-cf", tar + ".tmp", "--numeric-owner", "."])
    os.replace(tar + ".tmp", tar)
    shutil.rmtree(work, ignore_errors=True)
    log(f"rootfs cached ({os.path.getsize(tar) >> 20} MiB, {time.time() - t0:.0f}s)")
    return tar


def ensure_wheels() -> str:
    key = short_hash("cp311", "manylinux_x86_64", *IMAGE_REQS)
    wd = os.path.join(CACHE, f"wheels-{key}")
    if os.path.exists(os.path.join(wd, ".complete")):
        return wd
    log(f"pip download {' '.join(IMAGE_REQS)} for cp311/manylinux x86_64 -> {wd}")
    t0 = time.time()
    os.makedirs(wd, exist_ok=True)
    with progress("pip download"):
        run([*host_pip(), "download", "--disable-pip-version-check", "--progress-bar", "off",
             "--dest", wd, "--only-binary=:all:", "--python-version", "3.11",
             "--implementation", "cp", "--abi", "cp311",
             "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
             "--platform", "manylinux_2_28_x86_64", "--platform", "linux_x86_64", *IMAGE_REQS],
            quiet=not VERBOSE)
    write(os.path.join(wd, ".complete"), json.dumps(IMAGE_REQS))
    log(f"{len(os.listdir(wd)) - 1} wheels cached ({time.time() - t0:.0f}s)")
    return wd


# --------------------------------------------------------------------------- build
def build_image_tree(key: str, rootfs: str, wheels: str, whl: str) -> str:
    """Unpack the rootfs into a work folder and install the venv into it (chroot); returns it."""
    work = os.path.join(CACHE, "tmp", f"image-{key}")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    t0 = time.time()
    log("image: unpacking rootfs")
    run(["tar", "-C", work, "-xf", rootfs, "--numeric-owner"])
    os.makedirs(f"{work}/tmp/wheels", exist_ok=True)
    for f in os.listdir(wheels):
        if f.endswith(".whl"):
            shutil.copyfile(os.path.join(wheels, f), f"{work}/tmp/wheels/{f}")
    shutil.copyfile(whl, f"{work}/tmp/wheels/{os.path.basename(whl)}")
    reqs = " ".join(shlex.quote(r) for r in IMAGE_REQS)
    pip = "/opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check --no-index"
    chroot_env = "PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8"
    script = f"""set -e
mount -t proc proc {work}/proc
mount --bind /dev {work}/dev
chroot {work} /usr/bin/env -i {chroot_env} /bin/sh -c '
set -e
python3 -m venv /opt/venv
{pip} --find-links /tmp/wheels {reqs} /tmp/wheels/{os.path.basename(whl)}
/opt/venv/bin/vllm --version
/opt/venv/bin/ray --version
'
"""
    log("image: python3 -m venv /opt/venv + pip install --no-index "
        "(ray, huggingface_hub, safetensors, vllm stand-in)")
    with progress("pip install in the image"):
        run(["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script],
            quiet=not VERBOSE)
    shutil.rmtree(f"{work}/tmp/wheels")
    write(f"{work}/etc/spark-vllm-lab-image",
          f"lab serving image {key}: Debian {SUITE} + Ray + vLLM stand-in (no GPU engine)\n")
    log(f"image: rootfs ready ({time.time() - t0:.0f}s); docker import")
    return work
