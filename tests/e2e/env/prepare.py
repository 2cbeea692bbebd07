#!/usr/bin/env python3
"""Prepare the end-to-end environment: virtiofsd from trixie, QEMU, a kernel and an initramfs.

Why a script of its own: CI starts from a clean clone on a bare Debian 12 machine that reaches
only Debian's and PyPI's registries, so everything the e2e tests run must be fetched by package
name here.  Nothing prebuilt is committed; every download lands in a cache directory
(default /var/cache/fhmon-e2e, or $FHMON_E2E_CACHE) so a second run needs no network.

What it does (each step skipped when its output is already there):
  1. apt-get install qemu-system-x86 and runc (bookworm) unless installed (runc runs the
     injected virt-launcher pod's containers in test_runc_e2e.py);
  2. apt-get download busybox-static and the current bookworm kernel (linux-image-*-amd64);
  3. apt-get download virtiofsd and the libraries it needs from trixie, through a private apt
     configuration (never installed system-wide: bookworm's glibc is too old for it);
  4. dpkg -x the trixie packages into a private root, checks that virtiofsd runs through that
     root's own ld-linux with --library-path;
  5. the same for trixie's QEMU 10 (qemu-system-x86 with its firmware and libraries, in a root
     of its own): bookworm's QEMU 7.2 cannot migrate a vhost-user-fs device, the live migration
     test needs QEMU >= 8.2;
  6. extracts the kernel image and the modules virtiofs needs (resolved with modules.dep) and
     writes a base initramfs (busybox + modules; the tests append /init and the workload);
  7. records all paths in env.json, which the harness reads.

Run as root on Debian 12:  python3 tests/e2e/env/prepare.py   (stdlib only; idempotent)
"""

from __future__ import annotations

import argparse
import fcntl
import json
import lzma
import os
import re
import shutil
import struct
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpio import CpioWriter

#: Bump when the layout of the cache or of env.json changes, so stale caches are rebuilt.
FORMAT = 1
DEFAULT_CACHE = "/var/cache/fhmon-e2e"
TRIXIE_PACKAGES = ("virtiofsd", "libc6", "libcap-ng0", "libseccomp2", "libgcc-s1")
#: Dependencies of virtiofsd that --sandbox=none never uses (newuidmap is for --sandbox=namespace).
TRIXIE_UNNEEDED = frozenset({"uidmap"})
#: Modules the guest must load: the virtio PCI transport and the virtiofs filesystem.
GUEST_MODULES = ("virtio_pci", "virtiofs")
#: Folders whose module bytes are kept while reading the kernel package (others: depends= only).
MODULE_FOLDERS = ("/kernel/drivers/virtio/", "/kernel/fs/fuse/")
SYSTEM_PACKAGES = ("qemu-system-x86", "runc")
#: Trixie's QEMU for the live migration test.  Its dependency closure is resolved by apt (against
#: an empty dpkg status, so nothing installed on this machine counts) and only these packages and
#: shared libraries are kept: -nodefaults means no NIC, so no iPXE option ROM is needed.
TRIXIE_QEMU = "qemu-system-x86"
TRIXIE_QEMU_KEEP = re.compile(r"(lib.*|zlib1g|qemu-system-(x86|common|data)|seabios)")
#: vhost-user-fs migration (back-end device state transfer) arrived in QEMU 8.2.
TRIXIE_QEMU_MIN = (8, 2)
DEBIAN_FALLBACK_URI = "http://deb.debian.org/debian"
KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

_T0 = time.monotonic()


def log(msg: str) -> None:
    """Progress goes to stderr with elapsed time, so slow steps are visible in CI logs."""
    print(f"[prepare {time.monotonic() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


class PrepareError(RuntimeError):
    """The environment cannot be built; the message says what to fix."""


def run(argv: list[str], *, cwd: Path | None = None, capture: bool = False,
        env: dict[str, str] | None = None) -> str:
    """Run a command, failing loudly with its output (CI logs are all we get)."""
    log("$ " + " ".join(argv))
    full_env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C")
    if env:
        full_env.update(env)
    proc = subprocess.run(argv, cwd=cwd, env=full_env, stdin=subprocess.DEVNULL,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if proc.returncode != 0:
        raise PrepareError(f"command failed ({proc.returncode}): {' '.join(argv)}\n{proc.stdout}")
    if not capture and proc.stdout.strip():
        tail = proc.stdout.strip().splitlines()[-3:]
        for line in tail:
            log("  " + line)
    return proc.stdout


# ---------------------------------------------------------------- system packages (bookworm)

def dpkg_installed(pkg: str) -> bool:
    """True when dpkg says the package is fully installed."""
    proc = subprocess.run(["dpkg-query", "-W", "-f=${Status}", pkg], capture_output=True, text=True)
    return proc.returncode == 0 and proc.stdout.strip() == "install ok installed"


class AptState:
    """Runs `apt-get update` at most once per preparation, and only when something is missing.

    options select another apt configuration (the private trixie one) than the system's.
    """

    def __init__(self, options: Sequence[str] = ()) -> None:
        self.options = list(options)
        self.updated = False

    def update(self) -> None:
        if not self.updated:
            run(["apt-get", *self.options, "update"])
            self.updated = True


def ensure_system_packages(apt: AptState) -> None:
    """QEMU and runc come from bookworm and are installed normally (the e2e tests need them
    on PATH)."""
    missing = [p for p in SYSTEM_PACKAGES if not dpkg_installed(p)]
    if not missing:
        log(f"system packages present: {', '.join(SYSTEM_PACKAGES)}")
        return
    apt.update()
    run(["apt-get", "install", "-y", "--no-install-recommends", *missing])


def find_debs(directory: Path, pkg: str) -> list[Path]:
    """Cached .deb files of one package (apt-get download names them PKG_VERSION_ARCH.deb)."""
    return sorted(directory.glob(f"{pkg}_*.deb"))


def apt_download(pkgs: Sequence[str], dest: Path, apt_opts: list[str],
                 before: Callable[[], None]) -> dict[str, Path]:
    """Download packages into dest unless already cached; returns package -> .deb path."""
    dest.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    missing = [p for p in pkgs if not find_debs(dest, p)]
    if missing:
        before()
        # -o APT::Sandbox::User=root: _apt cannot write into a root-owned cache dir.
        run(["apt-get", *apt_opts, "-o", "APT::Sandbox::User=root", "download", *missing], cwd=dest)
    for p in pkgs:
        debs = find_debs(dest, p)
        if not debs:
            raise PrepareError(f"apt-get download left no {p}_*.deb in {dest}")
        if len(debs) > 1:
            log(f"warning: several cached versions of {p}, using {debs[-1].name}")
        out[p] = debs[-1]
    return out


def deb_field(deb: Path, field: str) -> str:
    """One control field of a .deb (Version, Depends...)."""
    return run(["dpkg-deb", "-f", str(deb), field], capture=True).strip()


# ---------------------------------------------------------------- trixie through a private apt

def debian_mirror_uri() -> str:
    """The machine's Debian archive URI (not -security): trixie comes from the same mirror."""
    sources = Path("/etc/apt/sources.list.d")
    candidates: list[str] = []
    for f in sorted(sources.glob("*.sources")):
        for stanza in f.read_text().split("\n\n"):
            fields: dict[str, str] = {}
            for line in stanza.splitlines():
                if line.startswith("#") or ":" not in line:
                    continue
                k, v = line.split(":", 1)
                fields[k.strip().lower()] = v.strip()
            suites = fields.get("suites", "").split()
            if "bookworm" in suites and "main" in fields.get("components", "").split():
                candidates.extend(fields.get("uris", "").split())
    for f in [Path("/etc/apt/sources.list"), *sorted(sources.glob("*.list"))]:
        if not f.exists():
            continue
        for line in f.read_text().splitlines():
            m = re.match(r"\s*deb\s+(?:\[[^\]]*\]\s+)?(\S+)\s+bookworm\s+.*\bmain\b", line)
            if m:
                candidates.append(m.group(1))
    for uri in candidates:
        if "security" not in uri:
            return uri
    log(f"no bookworm main source found, using {DEBIAN_FALLBACK_URI}")
    return DEBIAN_FALLBACK_URI


def trixie_apt_options(cache: Path) -> list[str]:
    """Private apt configuration for trixie: own sources file, lists and cache; system untouched."""
    root = cache / "apt-trixie"
    (root / "lists" / "partial").mkdir(parents=True, exist_ok=True)
    (root / "cache" / "archives" / "partial").mkdir(parents=True, exist_ok=True)
    sources = root / "trixie.list"
    keyring = KEYRING if Path(KEYRING).exists() else ""
    signed = f"[signed-by={keyring}] " if keyring else ""
    text = f"deb {signed}{debian_mirror_uri()} trixie main\n"
    if not sources.exists() or sources.read_text() != text:
        sources.write_text(text)
    return [
        "-o", f"Dir::Etc::sourcelist={sources}",
        "-o", "Dir::Etc::sourceparts=/dev/null",
        "-o", f"Dir::State::Lists={root / 'lists'}",
        "-o", f"Dir::Cache={root / 'cache'}",
        "-o", "Dir::Etc::preferencesparts=/dev/null",
    ]


def unpack(deb: Path, dest: Path) -> None:
    """dpkg -x: unpack without installing (trixie libraries must never reach the system)."""
    run(["dpkg", "-x", str(deb), str(dest)])


def unpack_root(debs: Iterable[Path], root: Path) -> Path:
    """dpkg -x every deb into root, unless root.stamp says exactly these debs are there."""
    debs = list(debs)
    stamp = root.with_name(root.name + ".stamp")
    stamp_text = "\n".join(sorted(deb.name for deb in debs))
    if stamp.exists() and stamp.read_text() == stamp_text:
        log(f"already unpacked: {root}")
        return root
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    for deb in debs:
        unpack(deb, root)
    stamp.write_text(stamp_text)
    return root


def find_real_file(root: Path, name: str) -> Path:
    """A regular file called name under root; symlinks may be absolute and point at the host."""
    for dirpath, _dirs, files in os.walk(root):
        if name in files:
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                return p
    raise PrepareError(f"{name} not found under {root}")


def prepare_trixie(cache: Path, trixie: AptState) -> dict[str, str]:
    """Download and unpack virtiofsd + its libraries; verify it runs through the private loader."""
    debs_dir = cache / "debs" / "trixie"
    debs = apt_download(TRIXIE_PACKAGES, debs_dir, trixie.options, trixie.update)
    depends = deb_field(debs["virtiofsd"], "Depends")
    names = {re.split(r"[\s(:]", d.strip())[0] for d in re.split(r"[,|]", depends) if d.strip()}
    extra = names - set(TRIXIE_PACKAGES) - TRIXIE_UNNEEDED
    if extra:
        raise PrepareError(f"virtiofsd now depends on {sorted(extra)}: add them to TRIXIE_PACKAGES")
    root = unpack_root(debs.values(), cache / "trixie-root")
    ld = find_real_file(root, "ld-linux-x86-64.so.2")
    libdirs = sorted({str(p.parent) for p in root.rglob("*.so*")
                      if p.parent.name == "x86_64-linux-gnu"})
    virtiofsd = root / "usr" / "libexec" / "virtiofsd"
    if not virtiofsd.exists():
        virtiofsd = find_real_file(root, "virtiofsd")
    libpath = ":".join(libdirs)
    version = run([str(ld), "--library-path", libpath, str(virtiofsd), "--version"],
                  capture=True).strip()
    log(f"virtiofsd runs: {version}")
    return {
        "virtiofsd": str(virtiofsd),
        "ld_so": str(ld),
        "library_path": libpath,
        "virtiofsd_version": version,
        "virtiofsd_deb": debs["virtiofsd"].name,
        "libc6_deb": debs["libc6"].name,
    }


def trixie_qemu_packages(cache: Path, trixie: AptState) -> list[str]:
    """Packages of trixie's QEMU and everything it links, resolved once and remembered.

    `apt-get -s install` against an empty dpkg status lists the whole dependency closure without
    touching the system; the list is kept in the cache so an offline re-run needs no apt lists.
    """
    remembered = cache / "trixie-qemu-packages"
    if remembered.exists():
        return remembered.read_text().split()
    empty_status = cache / "apt-trixie" / "empty-status"
    empty_status.write_text("")
    trixie.update()
    out = run(["apt-get", *trixie.options, "-o", f"Dir::State::status={empty_status}",
               "-s", "install", "--no-install-recommends", TRIXIE_QEMU], capture=True)
    closure = [line.split()[1] for line in out.splitlines() if line.startswith("Inst ")]
    pkgs = sorted(p for p in closure if TRIXIE_QEMU_KEEP.fullmatch(p))
    if TRIXIE_QEMU not in pkgs or "seabios" not in pkgs:
        raise PrepareError(f"apt resolved no {TRIXIE_QEMU} closure from trixie:\n{out[-3000:]}")
    remembered.write_text("\n".join(pkgs) + "\n")
    return pkgs


def prepare_trixie_qemu(cache: Path, trixie: AptState) -> dict[str, str]:
    """Download and unpack trixie's QEMU into its own root; check it runs through its loader.

    Kept apart from the virtiofsd root so that either can be rebuilt alone.  QEMU is run as
    `ld-linux --library-path LIBS qemu-system-x86_64 -L FIRMWARE...` with QEMU_MODULE_DIR set:
    its compiled-in paths (/usr/share/qemu, /usr/lib/x86_64-linux-gnu/qemu) would otherwise find
    bookworm's firmware and modules.
    """
    debs_dir = cache / "debs" / "trixie"
    pkgs = trixie_qemu_packages(cache, trixie)
    debs = apt_download(pkgs, debs_dir, trixie.options, trixie.update)
    root = unpack_root(debs.values(), cache / "trixie-qemu-root")
    libdir = root / "usr" / "lib" / "x86_64-linux-gnu"
    ld = libdir / "ld-linux-x86-64.so.2"
    qemu = root / "usr" / "bin" / "qemu-system-x86_64"
    firmware = [root / "usr" / "share" / "qemu", root / "usr" / "share" / "seabios"]
    for path in (ld, qemu, *firmware, firmware[1] / "bios-256k.bin"):
        if not path.exists():
            raise PrepareError(f"{path} missing after unpacking trixie's QEMU")
    first = run([str(ld), "--library-path", str(libdir), str(qemu), "--version"],
                capture=True).splitlines()[0].strip()
    m = re.search(r"version (\d+)\.(\d+)", first)
    if m is None or (int(m.group(1)), int(m.group(2))) < TRIXIE_QEMU_MIN:
        raise PrepareError(f"trixie's QEMU is too old for vhost-user-fs migration: {first}")
    log(f"trixie QEMU runs: {first}")
    return {
        "migration_qemu": str(qemu),
        "migration_qemu_ld_so": str(ld),
        "migration_qemu_library_path": str(libdir),
        "migration_qemu_firmware": ":".join(str(f) for f in firmware),
        "migration_qemu_module_dir": str(libdir / "qemu"),
        "migration_qemu_version": first,
        "migration_qemu_deb": debs[TRIXIE_QEMU].name,
    }


# ---------------------------------------------------------------- kernel, modules, initramfs

def kernel_package(apt: AptState) -> str:
    """The concrete kernel package behind linux-image-amd64 (e.g. linux-image-6.1.0-57-amd64)."""
    def resolve() -> str | None:
        out = subprocess.run(["apt-cache", "depends", "linux-image-amd64"],
                             capture_output=True, text=True)
        m = re.search(r"Depends:\s*(linux-image-\S+-amd64)\b", out.stdout)
        return m.group(1) if m else None

    name = resolve()
    if name is None:
        apt.update()
        name = resolve()
    if name is None:
        raise PrepareError("cannot resolve linux-image-amd64 to a kernel package")
    return name


def fsys_members(deb: Path) -> Iterable[tuple[tarfile.TarFile, tarfile.TarInfo]]:
    """Stream the data tarball of a .deb (dpkg-deb --fsys-tarfile) without unpacking all of it."""
    proc = subprocess.Popen(["dpkg-deb", "--fsys-tarfile", str(deb)], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    try:
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                yield tar, member
    finally:
        proc.stdout.close()
        proc.wait()


def member_bytes(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    """Contents of one regular file of a streamed tarball."""
    f = tar.extractfile(member)
    if f is None:
        raise PrepareError(f"cannot read {member.name} from the package")
    return f.read()


def module_name(path: str) -> str:
    """Module file path -> module name, with '-' folded to '_' as the kernel does."""
    base = path.rsplit("/", 1)[-1]
    base = re.sub(r"\.ko(\.(xz|zst|gz))?$", "", base)
    return base.replace("-", "_")


def modinfo_depends(elf: bytes) -> list[str]:
    """The depends= field of a module's .modinfo ELF section (what modinfo prints).

    Debian's kernel package ships no modules.dep (depmod runs at install time), and kmod may
    be missing, so the ELF64 section table is read directly.
    """
    if elf[:4] != b"\x7fELF" or elf[4] != 2:
        raise PrepareError("not an ELF64 kernel module")
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", elf, 0x3A)

    def section(i: int) -> tuple[int, int, int]:
        name, _type, _flags, _addr, off, size = struct.unpack_from(
            "<IIQQQQ", elf, shoff + i * shentsize)
        return name, off, size

    _n, stroff, _s = section(shstrndx)
    for i in range(shnum):
        name, off, size = section(i)
        end = elf.index(b"\0", stroff + name)
        if elf[stroff + name:end] == b".modinfo":
            for field in elf[off:off + size].split(b"\0"):
                if field.startswith(b"depends="):
                    return [d.replace("-", "_") for d in field[8:].decode().split(",") if d]
            return []
    raise PrepareError("kernel module without a .modinfo section")


def resolve_modules(depends: dict[str, list[str]], builtin: set[str],
                    wanted: Iterable[str]) -> list[str]:
    """Module names to insmod, dependencies first; built-in modules need nothing."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in builtin or name in order:
            return
        if name not in depends:
            raise PrepareError(f"kernel module {name} is neither in the package nor built in")
        for need in depends[name]:
            visit(need)
        order.append(name)

    for w in wanted:
        visit(w)
    return order


def prepare_kernel(cache: Path, busybox_deb: Path, kernel_deb: Path) -> dict[str, str]:
    """Extract vmlinuz + needed modules and write the base initramfs (busybox, modules, /dev)."""
    kdir = cache / "kernel"
    stamp = cache / "kernel.stamp"
    stamp_text = f"{FORMAT}\n{kernel_deb.name}\n{busybox_deb.name}\n{','.join(GUEST_MODULES)}"
    info_file = kdir / "info.json"
    if stamp.exists() and stamp.read_text() == stamp_text and info_file.exists():
        log(f"kernel and base initramfs already built: {kdir}")
        cached: dict[str, str] = json.loads(info_file.read_text())
        return cached
    shutil.rmtree(kdir, ignore_errors=True)
    kdir.mkdir(parents=True)

    # One pass over the package: the kernel image, modules.builtin and every module's depends=.
    vmlinuz: Path | None = None
    builtin_text = ""
    kver = ""
    depends: dict[str, list[str]] = {}
    blobs: dict[str, bytes] = {}
    for tar, m in fsys_members(kernel_deb):
        name = m.name.lstrip("./")
        if not m.isfile():
            continue
        if re.fullmatch(r"boot/vmlinuz-.*", name):
            kver = name.split("vmlinuz-", 1)[1]
            vmlinuz = kdir / "vmlinuz"
            vmlinuz.write_bytes(member_bytes(tar, m))
        elif re.fullmatch(r"(usr/)?lib/modules/[^/]+/modules\.builtin", name):
            builtin_text = member_bytes(tar, m).decode()
        elif re.fullmatch(r"(usr/)?lib/modules/.*\.ko(\.xz)?", name):
            data = member_bytes(tar, m)
            if name.endswith(".xz"):
                data = lzma.decompress(data)   # busybox insmod wants a plain ELF file
            mod = module_name(name)
            depends[mod] = modinfo_depends(data)
            if mod in GUEST_MODULES or any(f in name for f in MODULE_FOLDERS):
                blobs[mod] = data
    if vmlinuz is None or not depends:
        raise PrepareError(f"{kernel_deb.name}: no boot/vmlinuz-* or modules inside")
    builtin = {module_name(line) for line in builtin_text.split()}
    order = resolve_modules(depends, builtin, GUEST_MODULES)
    log(f"kernel {kver}: guest loads {', '.join(order)}")
    missing = [mod for mod in order if mod not in blobs]
    if missing:
        # A dependency outside the expected folders: one more pass to fetch exactly those.
        for tar, m in fsys_members(kernel_deb):
            name = m.name.lstrip("./")
            if m.isfile() and module_name(name) in missing and ".ko" in name:
                data = member_bytes(tar, m)
                blobs[module_name(name)] = lzma.decompress(data) if name.endswith(".xz") else data

    # Busybox (static) from its package.
    bb_root = cache / "busybox-root"
    shutil.rmtree(bb_root, ignore_errors=True)
    unpack(busybox_deb, bb_root)
    busybox = bb_root / "bin" / "busybox"
    if not busybox.exists():
        raise PrepareError(f"{busybox_deb.name} has no bin/busybox")

    initrd = kdir / "base-initramfs.cpio"
    tmp = initrd.with_suffix(".tmp")
    with open(tmp, "wb") as fh:
        w = CpioWriter(fh)
        for d in ("bin", "sbin", "usr", "usr/bin", "usr/sbin", "dev", "proc", "sys", "tmp",
                  "mnt", "etc", "lib", "lib/modules"):
            w.directory(d, 0o755)
        w.char_device("dev/console", 0o600, 5, 1)
        w.char_device("dev/null", 0o666, 1, 3)
        w.file("bin/busybox", busybox.read_bytes(), 0o755)
        w.symlink("bin/sh", "busybox")
        names: list[str] = []
        for mod in order:
            w.file(f"lib/modules/{mod}.ko", blobs[mod], 0o644)
            names.append(f"{mod}.ko")
        w.file("etc/e2e-modules", ("\n".join(names) + "\n").encode(), 0o644)
        w.trailer()
    tmp.rename(initrd)
    bb_version = run([str(busybox), "--help"], capture=True).splitlines()[0]
    info = {
        "kernel": str(vmlinuz),
        "kernel_version": kver,
        "kernel_deb": kernel_deb.name,
        "base_initramfs": str(initrd),
        "guest_modules": ",".join(names),
        "busybox": str(busybox),
        "busybox_version": bb_version.strip(),
    }
    info_file.write_text(json.dumps(info, indent=2))
    stamp.write_text(stamp_text)
    return info


# ---------------------------------------------------------------- main

def check_searchable(path: Path) -> None:
    """virtiofsd runs as uid 65534 through files here: every ancestor must be world-searchable."""
    for p in [path, *path.parents]:
        mode = p.stat().st_mode
        if not mode & 0o001:
            raise PrepareError(f"{p} is not searchable by other users (mode {mode & 0o7777:o}); "
                               f"unprivileged virtiofsd cannot reach {path}")


def prepare(cache: Path) -> dict[str, str]:
    """Build (or reuse) everything; returns what env.json records."""
    if os.geteuid() != 0:
        raise PrepareError("run as root (apt-get install, apt-get download)")
    cache.mkdir(parents=True, exist_ok=True)
    cache.chmod(0o755)
    check_searchable(cache)
    apt = AptState()
    ensure_system_packages(apt)
    qemu = shutil.which("qemu-system-x86_64")
    if qemu is None:
        raise PrepareError("qemu-system-x86_64 not on PATH after installing qemu-system-x86")

    bookworm = cache / "debs" / "bookworm"
    kpkg_file = cache / "kernel-package"
    if kpkg_file.exists() and find_debs(bookworm, kpkg_file.read_text().strip()):
        kpkg = kpkg_file.read_text().strip()   # offline re-run: keep the cached kernel
    else:
        kpkg = kernel_package(apt)
        kpkg_file.write_text(kpkg + "\n")
    debs = apt_download(["busybox-static", kpkg], bookworm, [], apt.update)

    env: dict[str, str] = {"format": str(FORMAT), "cache": str(cache), "qemu": qemu}
    env["qemu_version"] = run([qemu, "--version"], capture=True).splitlines()[0]
    trixie = AptState(trixie_apt_options(cache))
    env.update(prepare_trixie(cache, trixie))
    env.update(prepare_trixie_qemu(cache, trixie))
    env.update(prepare_kernel(cache, debs["busybox-static"], debs[kpkg]))
    out = cache / "env.json"
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(env, indent=2) + "\n")
    tmp.rename(out)
    log(f"ready: {out}")
    return env


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", default=os.environ.get("FHMON_E2E_CACHE", DEFAULT_CACHE),
                        help="cache directory (default $FHMON_E2E_CACHE or %(default)s)")
    args = parser.parse_args()
    cache = Path(args.cache).resolve()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)   # concurrent test sessions share one cache
        try:
            env = prepare(cache)
        except PrepareError as e:
            log(f"FAILED: {e}")
            return 1
    print(json.dumps(env, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
