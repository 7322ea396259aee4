"""Which libnccl runs and which build it is (hostscripts/payloads/nccl_library.py, issue 51), on
this machine's own files: a real shared library's GNU build ID (checked against the same note
read through the section headers, another path to it), the Debian package that ships it, and
the `host` mode with a stand-in `ldconfig`. The `loaded` mode imports torch: it runs in the
lab's serving image (the image probe of tests/e2e) and here only where torch is absent or has no
CUDA, with a stand-in torch."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

from hostscripts.common import payload
from tests.conftest import ROOT
from tests.stand_in import python_stand_in

LIBC = "/lib/x86_64-linux-gnu/libc.so.6" if os.path.exists(
    "/lib/x86_64-linux-gnu/libc.so.6") else "/lib/aarch64-linux-gnu/libc.so.6"


def _module():
    path = ROOT / "hostscripts" / "payloads" / "nccl_library.py"
    spec = importlib.util.spec_from_file_location("nccl_library", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # its main is behind __name__ == "__main__"
    return module


def build_id_by_sections(path: str) -> str:
    """The .note.gnu.build-id section's descriptor, found through the section headers (the
    payload reads the PT_NOTE segments instead): ELF64 little-endian only."""
    data = Path(path).read_bytes()
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, offset, size = struct.unpack_from("<IIQQQQ", data,
                                                                      shoff + i * shentsize)
        return name, offset, size
    _n, str_off, _s = section(shstrndx)
    for i in range(shnum):
        name, offset, _size = section(i)
        end = data.index(b"\0", str_off + name)
        if data[str_off + name:end] == b".note.gnu.build-id":
            namesz, descsz, _kind = struct.unpack_from("<III", data, offset)
            start = offset + 12 + ((namesz + 3) & ~3)
            return data[start:start + descsz].hex()
    raise AssertionError(f"{path} has no .note.gnu.build-id section")


def test_the_build_id_of_a_real_library_is_its_gnu_note():
    m = _module()
    real = os.path.realpath(LIBC)
    assert m.build_id(real) == build_id_by_sections(real)
    assert len(m.build_id(real)) == 40  # SHA-1, as Debian's toolchain writes it
    assert m.build_id("/etc/hostname") is None  # not an ELF file
    assert m.build_id("/no/such/file") is None


def test_a_library_a_debian_package_ships_is_the_systems(tmp_path):
    m = _module()
    d = m.describe(LIBC)
    assert d["source"] == "system" and d["package"] == "libc6", d
    status = Path("/var/lib/dpkg/status").read_text()
    assert f"Version: {d['packageVersion']}\n" in status
    assert d["realPath"] == os.path.realpath(LIBC) and d["size"] == os.path.getsize(LIBC)
    # a copy nobody's package lists: `other`, its version read from its name
    copy = tmp_path / "libnccl.so.2.28.9"
    shutil.copy(LIBC, copy)
    d = m.describe(str(copy))
    assert (d["source"], d["package"], d["version"]) == ("other", None, "2.28.9")
    assert d["build"] == build_id_by_sections(os.path.realpath(LIBC))


def test_ncclgetversion_codes():
    m = _module()
    assert m.version_code(22809) == "2.28.9"
    assert m.version_code(22907) == "2.29.7"
    assert m.version_code(2708) == "2.7.8"


def test_host_mode_describes_what_the_dynamic_linker_knows(tmp_path):
    lib = tmp_path / "lib"
    lib.mkdir()
    shutil.copy(LIBC, lib / "libnccl.so.2.28.9")
    (lib / "libnccl.so.2").symlink_to("libnccl.so.2.28.9")
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    python_stand_in(bin_ / "ldconfig", "print('3 libs found in cache `/etc/ld.so.cache`')\n"
                    f"print('\\tlibnccl.so.2 (libc6,x86-64) => {lib}/libnccl.so.2')\n"
                    f"print('\\tlibc.so.6 (libc6,x86-64) => {LIBC}')\n")
    done = subprocess.run([sys.executable, "-c", payload("nccl_library.py"), "host"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}"})
    assert done.returncode == 0, done.stderr
    libs = json.loads(done.stdout)["libraries"]
    mine = [x for x in libs if x["path"] == f"{lib}/libnccl.so.2"]
    assert len(mine) == 1, libs
    assert mine[0]["realPath"] == f"{lib}/libnccl.so.2.28.9"
    assert mine[0]["version"] == "2.28.9" and mine[0]["source"] == "other"
    assert not any("libc.so" in x["path"] for x in libs)  # only libnccl


def test_loaded_mode_says_why_it_knows_no_library(tmp_path):
    done = subprocess.run([sys.executable, "-c", payload("nccl_library.py"), "loaded"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    answer = json.loads(done.stdout)
    assert answer["vllm"] is None and answer["reason"].startswith("torch cannot be imported")
    # a CPU build of torch: vLLM loads no NCCL (vllm/utils/nccl.py raises for it)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "class version:\n    cuda = None\n    hip = None\n")
    done = subprocess.run([sys.executable, "-c", payload("nccl_library.py"), "loaded"],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    answer = json.loads(done.stdout)
    assert answer == {"reason": "a torch without CUDA: vLLM loads no NCCL", "soPath": None,
                      "torch": [], "vllm": None}
    # VLLM_NCCL_SO_PATH names a file that is no NCCL: it cannot be loaded as vLLM loads it
    done = subprocess.run([sys.executable, "-c", payload("nccl_library.py"), "loaded"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(tmp_path),
                               "VLLM_NCCL_SO_PATH": LIBC})
    answer = json.loads(done.stdout)
    assert answer["soPath"] == LIBC and answer["vllm"] is None
    assert answer["reason"].startswith(f"{LIBC} cannot be loaded as vLLM loads it"), answer


def test_the_probe_leaves_its_answer_where_recon_reads_it(tmp_path):
    """hostscripts/images.image_probe with the stack's names: the image's answer (here the lab's
    real one, from a stand-in docker) is printed and left as the record recon's image_nccl
    section reads back (inspection/recon.IMAGE_RECORDS, parsers.parse_image_nccl)."""
    from hostscripts.images import image_probe, image_probe_remove
    from hostscripts.paths import StackNames
    from inspection import parsers, recon

    answer = (ROOT / "tests" / "fixtures" / "collective" / "image-probe-lab-spark-1.txt") \
        .read_text().split("\n", 1)[1]
    image = "sha256:" + "14638ee059096d69deb74203c6810104f71c1606f8f3201ffde99461b14009cb"
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    python_stand_in(bin_ / "docker", "import os, sys\n"
                    "assert 'nvidia_nccl' not in sys.argv[-1] and '\"nccl\": ' in sys.argv[-1]\n"
                    "sys.stdout.write(open(os.environ['ANSWER']).read())\n")
    (tmp_path / "answer").write_text("a warning first\n" + answer)
    names = StackNames("dev")
    script = image_probe(image, {"spark-vllm.role": "image-probe"}, record=names)
    sandbox = str(tmp_path)
    env = {**os.environ, "PATH": f"{bin_}:{os.environ['PATH']}", "ANSWER": str(tmp_path / "answer")}
    done = subprocess.run(["/bin/sh", "-c", script.replace("/var/lib/spark-vllm",
                                                           f"{sandbox}/var/lib/spark-vllm")],
                          capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "a warning first\n" + answer
    folder = f"{sandbox}{names.image_probe_dir}"
    listed = subprocess.run(["bash", "-c", recon.IMAGE_RECORDS, "_", folder],
                            capture_output=True, text=True, check=True).stdout
    found = parsers.parse_image_nccl(listed)
    assert list(found) == [image]
    assert found[image].vllm is not None and found[image].vllm.package == "nvidia-nccl-cu13"
    subprocess.run(["/bin/sh", "-c", image_probe_remove(names, image).replace(
        "/var/lib/spark-vllm", f"{sandbox}/var/lib/spark-vllm")], check=True)
    assert subprocess.run(["bash", "-c", recon.IMAGE_RECORDS, "_", folder], capture_output=True,
                          text=True, check=True).stdout == ""
