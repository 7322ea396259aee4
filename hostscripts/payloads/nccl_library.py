# NCCL library (which libnccl runs, and which build it is). Two modes, argv[1]:
#   host    on a node, with its python3 (recon's `nccl_host` section): every libnccl the dynamic
#           linker knows (`ldconfig -p`), each described. Nothing is loaded.
#   loaded  in the serving image, as the image probe's child (payloads/image_probe.py): what a
#           vLLM process loads. As vLLM 0.32's find_nccl_library (vllm/utils/nccl.py) and its
#           NCCL wrapper (vllm/distributed/device_communicators/pynccl_wrapper.py) do: torch
#           first (its libtorch_cuda links libnccl.so.2, pip's nvidia-nccl-cu* through its
#           RUNPATH), then ctypes.CDLL of VLLM_NCCL_SO_PATH or, with a CUDA torch, of the name
#           libnccl.so.2, which the dynamic linker answers with the library already loaded under
#           that soname. The file that defines ncclGetVersion in vLLM's handle (dladdr) is what
#           vLLM's collectives run on; ncclGetVersion gives its version. torch's own (the NCCL
#           of its ProcessGroupNCCL) is what /proc/self/maps shows after the import.
# A library is described by its real path, size, GNU build ID (the ELF note NT_GNU_BUILD_ID:
# two builds of one version differ there, as pip's nvidia-nccl-cu13 2.28.9 and DGX OS's libnccl2
# 2.28.9 do, vLLM issues 42354 and 41725), version, and where it comes from: `pip` (the wheel
# whose RECORD lists it: package and version), `system` (the Debian package whose file list
# names it: /var/lib/dpkg/info/<package>.list and its version in /var/lib/dpkg/status) or
# `other`. Prints one JSON object.
# The lines above are not sent to the node.

import ctypes, glob, importlib.metadata as md, json, os, re, struct, subprocess, sys


def build_id(path):
    """The GNU build ID (hex) of an ELF file, from its PT_NOTE segments; None when it has none."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
            if len(head) < 52 or head[:4] != b"\x7fELF":
                return None
            wide, end = head[4] == 2, "<" if head[5] == 1 else ">"
            if wide:
                phoff = struct.unpack_from(end + "Q", head, 32)[0]
                phentsize, phnum = struct.unpack_from(end + "HH", head, 54)
            else:
                phoff = struct.unpack_from(end + "I", head, 28)[0]
                phentsize, phnum = struct.unpack_from(end + "HH", head, 42)
            for i in range(min(phnum, 512)):
                fh.seek(phoff + i * phentsize)
                ph = fh.read(phentsize)
                if len(ph) < (56 if wide else 32) or struct.unpack_from(end + "I", ph, 0)[0] != 4:
                    continue  # not PT_NOTE
                if wide:
                    offset, size = struct.unpack_from(end + "Q", ph, 8)[0], struct.unpack_from(end + "Q", ph, 32)[0]
                else:
                    offset, size = struct.unpack_from(end + "I", ph, 4)[0], struct.unpack_from(end + "I", ph, 16)[0]
                fh.seek(offset)
                data = fh.read(min(size, 1 << 16))
                pos = 0
                while pos + 12 <= len(data):
                    namesz, descsz, kind = struct.unpack_from(end + "III", data, pos)
                    pos += 12
                    name = data[pos:pos + namesz]
                    pos += (namesz + 3) & ~3
                    desc = data[pos:pos + descsz]
                    pos += (descsz + 3) & ~3
                    if kind == 3 and name.rstrip(b"\0") == b"GNU" and desc:
                        return desc.hex()
    except (OSError, struct.error):
        return None
    return None


def pip_owner(real):
    """(distribution, version) of the installed wheel that ships `real`, or None."""
    for dist in md.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if "nccl" not in name:
            continue
        for f in dist.files or []:
            if "libnccl" in str(f) and os.path.realpath(str(dist.locate_file(f))) == real:
                return dist.metadata["Name"], dist.version
    return None


def dpkg_owner(real, paths):
    """(package, version) of the Debian package whose file list names the library, or None."""
    names = set()
    for p in paths:  # a merged /usr: dpkg may list either spelling
        names.update((p, p[len("/usr"):] if p.startswith("/usr/lib/") else "/usr" + p))
    for listing in glob.glob("/var/lib/dpkg/info/*.list"):
        try:
            with open(listing, errors="replace") as fh:
                files = {ln.rstrip("\n") for ln in fh}
        except OSError:
            continue
        if not (files & names) and real not in files:
            continue
        package = os.path.basename(listing)[:-len(".list")].split(":", 1)[0]
        version = None
        try:
            with open("/var/lib/dpkg/status", errors="replace") as fh:
                for block in fh.read().split("\n\n"):
                    if re.search(r"^Package: %s$" % re.escape(package), block, re.M):
                        m = re.search(r"^Version: (\S+)$", block, re.M)
                        version = m.group(1) if m else None
                        break
        except OSError:
            pass
        return package, version
    return None


def version_from_name(real):
    m = re.search(r"libnccl\.so\.(\d+\.\d+\.\d+)$", real)
    return m.group(1) if m else None


def version_code(code):
    """ncclGetVersion's number: 22809 -> 2.28.9 (NCCL >= 2.9), 2708 -> 2.7.8 (older)."""
    if code >= 10000:
        return "%d.%d.%d" % (code // 10000, code // 100 % 100, code % 100)
    return "%d.%d.%d" % (code // 1000, code // 100 % 10, code % 100)


def describe(path, version=None):
    real = os.path.realpath(path)
    out = {"path": path, "realPath": real, "size": None, "build": build_id(real),
           "version": version or version_from_name(real), "source": "other", "package": None,
           "packageVersion": None}
    try:
        out["size"] = os.path.getsize(real)
    except OSError:
        pass
    owner = pip_owner(real)
    if owner:
        out["source"], (out["package"], out["packageVersion"]) = "pip", owner
    else:
        owner = dpkg_owner(real, [path, real])
        if owner:
            out["source"], (out["package"], out["packageVersion"]) = "system", owner
    if out["version"] is None and out["packageVersion"]:
        m = re.match(r"(\d+\.\d+\.\d+)", out["packageVersion"])
        out["version"] = m.group(1) if m else None
    return out


def host():
    found = []
    try:
        text = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True,
                              timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        text = ""
    for line in text.splitlines():
        m = re.match(r"\s*(libnccl\.so[.\d]*) .*=> (\S+)$", line)
        if m:
            found.append(m.group(2))
    for pattern in ("/usr/lib/*-linux-gnu/libnccl.so.2", "/usr/local/cuda*/lib*/libnccl.so.2",
                    "/usr/local/nccl*/lib/libnccl.so.2"):
        found += glob.glob(pattern)
    seen, out = set(), []
    for path in found:
        real = os.path.realpath(path)
        if real in seen or not os.path.exists(real):
            continue
        seen.add(real)
        out.append(describe(path))
    return {"libraries": out}


class DlInfo(ctypes.Structure):
    _fields_ = [("fname", ctypes.c_char_p), ("fbase", ctypes.c_void_p),
                ("sname", ctypes.c_char_p), ("saddr", ctypes.c_void_p)]


def mapped():
    try:
        with open("/proc/self/maps") as fh:
            return sorted({ln.split()[-1] for ln in fh
                           if "libnccl" in ln and ln.rstrip().split()[-1].startswith("/")})
    except OSError:
        return []


def loaded():
    answer = {"vllm": None, "torch": [], "soPath": os.environ.get("VLLM_NCCL_SO_PATH") or None,
              "reason": None}
    try:
        import torch
    except Exception as exc:
        answer["reason"] = "torch cannot be imported: %s: %s" % (type(exc).__name__, exc)
        return answer
    answer["torch"] = [describe(p) for p in mapped()]
    so = answer["soPath"] or ("libnccl.so.2" if torch.version.cuda is not None else None)
    if so is None:
        answer["reason"] = "a torch without CUDA: vLLM loads no NCCL"
        return answer
    try:
        lib = ctypes.CDLL(so)
        code = ctypes.c_int()
        if lib.ncclGetVersion(ctypes.byref(code)) != 0:
            raise OSError("ncclGetVersion failed")
        info = DlInfo()
        if not ctypes.CDLL(None).dladdr(ctypes.cast(lib.ncclGetVersion, ctypes.c_void_p),
                                        ctypes.byref(info)) or not info.fname:
            raise OSError("dladdr does not name the library")
        answer["vllm"] = describe(info.fname.decode(errors="replace"), version_code(code.value))
    except (OSError, AttributeError) as exc:
        answer["reason"] = "%s cannot be loaded as vLLM loads it: %s" % (so, exc)
    return answer


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "host"
    print(json.dumps(host() if mode == "host" else loaded(), sort_keys=True), flush=True)
