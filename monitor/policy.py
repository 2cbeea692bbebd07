"""Confinement policy: which shares may be registered, and what lies inside a share.

One module, so a reviewer finds every decision about "inside" and "allowed" here:
- a share root must match an --allow glob by its real host path (no symlinks in the path);
- an object is inside a share when it is on the share's own mount (not a submount, not
  another filesystem) and, unless the share covers its whole filesystem (the root of a
  mount that shows the filesystem's root), below the share directory in the filesystem's
  own tree. "Below" is decided on fds, never on path strings: walking '..' from the object
  (a directory, or a file's parent directory) must meet the share root before it leaves the
  share's mount or the filesystem. The kernel answers ENOENT for '..' of a dentry that a
  bind mount of a subdirectory does not contain, which ends such a walk at once; no path
  has to fit in PATH_MAX;
- whether the target could chmod an object itself (chmod_would_succeed), which decides
  whether an O_PATH open by handle that the kernel's read check refuses may be served.
"""

from __future__ import annotations

import array
import errno
import fcntl
import fnmatch
import glob
import os
import stat
from dataclasses import dataclass, field

from monitor import linux, signing
from monitor.plane.target_thread import SyscallError
from protocol import kernel, refusals
from protocol.share import ShareFacts


class RegistrationRefused(Exception):
    """A registration is refused; the text goes back to the client verbatim."""

    def __init__(self, reason: str, err: int = errno.EACCES) -> None:
        super().__init__(reason)
        self.reason = reason
        self.errno = err


fd_path = linux.fd_path


def glob_matches(pattern: str, path: str) -> bool:
    """Shell-glob semantics: each '/'-separated component matches on its own."""
    pat_parts = pattern.rstrip("/").split("/") if pattern != "/" else [""]
    path_parts = path.rstrip("/").split("/") if path != "/" else [""]
    if len(pat_parts) != len(path_parts):
        return False
    return all(fnmatch.fnmatchcase(p, g) for g, p in zip(pat_parts, path_parts, strict=True))


def is_below(path: str, root: str) -> bool:
    root = root.rstrip("/")
    return path == root or path.startswith(root + "/") or root == ""


@dataclass(slots=True)
class Share:
    """A pinned share root: its facts (protocol.share.ShareFacts, fixed at registration) and
    the fds that keep naming the same directory whatever happens to paths, which it owns."""

    facts: ShareFacts
    path_fd: int  # O_PATH, for identity and path checks
    dir_fd: int  # O_RDONLY|O_DIRECTORY: a valid mount_fd for open_by_handle_at
    refs: int = field(default=1)

    def close(self) -> None:
        for fd in (self.path_fd, self.dir_fd):
            if fd >= 0:
                os.close(fd)
        self.path_fd = self.dir_fd = -1

    def current_path(self) -> str:
        return fd_path(self.path_fd)


def pin_share(root_fd: int, target_path: str, allow: list[str],
              mountinfo_pid: int | None = None) -> Share:
    """Resolve target_path inside the target's root (root_fd), pin it, check --allow.

    Must run with the registering client's credentials in force, so that a client can only
    register a share it can reach itself. mountinfo_pid: a process of the mount namespace
    the share was resolved in (the target), whose mountinfo says whether the share's mount
    shows its filesystem's root; without it the share never counts as a whole filesystem.
    """
    if not target_path.startswith("/"):
        raise RegistrationRefused(f"share {target_path!r} must be an absolute path", errno.EINVAL)
    if "\0" in target_path or len(target_path.encode()) >= kernel.PATH_MAX:
        raise RegistrationRefused("share path is not a valid path", errno.EINVAL)
    try:
        path_fd = linux.openat2(root_fd, target_path.encode(), os.O_PATH | os.O_DIRECTORY
                                | os.O_CLOEXEC, kernel.RESOLVE_IN_ROOT | kernel.RESOLVE_NO_SYMLINKS
                                | kernel.RESOLVE_NO_MAGICLINKS)
    except OSError as exc:
        hint = "; give its canonical path (no symlinks)" if exc.errno == errno.ELOOP else ""
        raise RegistrationRefused(f"share {target_path}: {os.strerror(exc.errno or 0)}{hint}",
                                  exc.errno or errno.EINVAL) from None
    dir_fd = -1
    try:
        try:
            dir_fd = os.open(f"/proc/self/fd/{path_fd}", os.O_RDONLY | os.O_DIRECTORY
                             | os.O_CLOEXEC)
        except OSError as exc:
            raise RegistrationRefused(
                f"share {target_path}: the client cannot read it "
                f"({os.strerror(exc.errno or 0)})", exc.errno or errno.EACCES) from None
        host_path = _allowed_host_path(path_fd, allow)
        if host_path is None:
            raise RegistrationRefused(
                f"share {target_path} (host path {fd_path(path_fd)}) is not in the allow-list")
        st = os.fstat(path_fd)
        mnt = linux.mount_id(path_fd)
        share_id = _share_id(path_fd, filesystem_identity(dir_fd))
        parent = os.open("..", os.O_PATH | os.O_CLOEXEC, dir_fd=path_fd)
        try:
            pst = os.fstat(parent)
            is_root = linux.mount_id(parent) != mnt or (pst.st_dev, pst.st_ino) == (
                st.st_dev, st.st_ino)
        finally:
            os.close(parent)
        whole_fs = (is_root and mountinfo_pid is not None
                    and linux.fstatfs(path_fd)[0] in LOCAL_FILESYSTEMS
                    and _mount_shows_fs_root(mountinfo_pid, path_fd))
        facts = ShareFacts(share_id, mnt, st.st_dev, st.st_ino, host_path, target_path,
                           is_root, whole_fs)
        return Share(facts, path_fd, dir_fd)
    except BaseException:
        os.close(path_fd)
        if dir_fd >= 0:
            os.close(dir_fd)
        raise


# statfs f_type of local filesystems whose superblock root is all a handle can name. A
# network filesystem's mount root is its own superblock's root even for a subdirectory of
# the server's export (mountinfo says "/"), while the server may decode handles beyond it;
# such shares are always walked.
LOCAL_FILESYSTEMS = frozenset({
    kernel.EXT4_SUPER_MAGIC,  # ext2, ext3, ext4
    kernel.XFS_SUPER_MAGIC,
    kernel.BTRFS_SUPER_MAGIC,  # every subvolume is in the top-level tree
    kernel.TMPFS_MAGIC,
    kernel.F2FS_SUPER_MAGIC,
})


def _mount_shows_fs_root(pid: int, path_fd: int) -> bool:
    """Whether the mount of path_fd shows its filesystem's root ("/" in mountinfo's fourth
    field; a bind mount of a subdirectory shows that subdirectory). Looked up by the old
    mount id, which no two live mounts share; anything unreadable counts as "no"."""
    old_id = linux.statx_identity(path_fd, unique=False)[3]
    try:
        with open(f"/proc/{pid}/mountinfo", "rb") as mountinfo:
            for line in mountinfo:
                fields = line.split(b" ", 4)
                if len(fields) >= 4 and fields[0] == str(old_id).encode():
                    return fields[3] == b"/"
    except OSError:
        pass
    return False


def _share_id(path_fd: int, filesystem: bytes) -> bytes:
    """Hash of the filesystem's identity and the share root's handle (a FID handle where
    the fs cannot export)."""
    for flags in (kernel.AT_EMPTY_PATH, kernel.AT_EMPTY_PATH | kernel.AT_HANDLE_FID):
        try:
            handle_type, f_handle, _ = linux.name_to_handle_at(path_fd, b"", flags)
            return signing.share_id_from_handle(handle_type, f_handle, filesystem)
        except OSError:
            continue
    raise RegistrationRefused("the share's filesystem gives no file handles at all",
                              errno.EOPNOTSUPP)


def filesystem_identity(fd: int) -> bytes:
    """What tells this filesystem from every other, the same on every node that mounts it:
    the superblock UUID (FS_IOC_GETFSUUID: ext4, xfs, btrfs, tmpfs, ...), else the statfs
    f_fsid (NFS: the server's fsid), else nothing (b"": then two roots of such filesystems
    with equal handles share an id). A clone of a volume copies its UUID: see
    docs/semantics.md."""
    uuid = linux.fs_uuid(fd)
    if uuid.strip(b"\0"):
        return b"uuid:" + uuid
    try:
        fsid = linux.fstatfs(fd)[1]
    except OSError:
        return b""
    return b"fsid:" + fsid if fsid.strip(b"\0") else b""


def _allowed_host_path(path_fd: int, allow: list[str]) -> str | None:
    """The host path of the pinned dir if it is an allowed share root, compared by inode."""
    st = os.fstat(path_fd)
    candidates = [fd_path(path_fd)]
    for pattern in allow:
        if any(glob_matches(pattern, c) for c in candidates) and _same_dir(candidates[0], st):
            return candidates[0]
    for pattern in allow:  # the client's mount namespace may show the dir elsewhere
        for match in glob.glob(pattern):
            if _same_dir(match, st):
                return match
    return None


def _same_dir(path: str, st: os.stat_result) -> bool:
    try:
        other = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    return stat.S_ISDIR(other.st_mode) and (other.st_dev, other.st_ino) == (st.st_dev, st.st_ino)


# --- inside-the-share checks --------------------------------------------------------------

def check_resolved(share: Share, obj_fd: int, obj_mount_id: int) -> None:
    """For name_to_handle_at: the looked-up object (its fd and unique mount id) must be
    inside the share.

    EOPNOTSUPP for a submount inside the share (virtiofsd then keeps its own O_PATH fd, as
    for any filesystem without handles) and for a file whose place cannot be checked (see
    _file_inside); EACCES for anything outside the share.
    """
    if obj_mount_id != share.facts.mount_id:
        try:
            on_submount = is_below(fd_path(obj_fd), share.current_path())
        except OSError:  # too deep to print: outside for this answer, refused either way
            on_submount = False
        if on_submount:
            raise SyscallError.refusing(refusals.SUBMOUNT)
        raise SyscallError.refusing(refusals.OUTSIDE_SHARE_MOUNT)
    if share.facts.whole_fs:
        return
    mode = os.fstat(obj_fd).st_mode
    inside = _dir_inside(share, obj_fd) if stat.S_ISDIR(mode) else _file_inside(share, obj_fd)
    if not inside:
        raise SyscallError.refusing(refusals.OUTSIDE_SHARE)


def check_opened(share: Share, obj_fd: int, is_dir: bool, obj_mount_id: int) -> None:
    """For open_by_handle_at: the fd comes from the share's mount (mount_fd is the share), so
    only a directory moved out of a share that does not cover its whole filesystem can be
    outside; directories are always connected, so '..' walks up from them. Non-directories
    are trusted on their MAC (like NFS no_subtree_check): their dentry may be disconnected.
    """
    if obj_mount_id != share.facts.mount_id:
        raise SyscallError.refusing(refusals.OPENED_OUTSIDE_MOUNT)
    if share.facts.whole_fs or not is_dir:
        return
    if not _dir_inside(share, obj_fd):
        raise SyscallError.refusing(refusals.DIRECTORY_LEFT_SHARE)


def _dir_inside(share: Share, dir_fd: int) -> bool:
    """Walk '..' from a directory fd: inside when the walk meets the share root (same inode
    on the share's mount) before it leaves that mount, tops out, or the kernel refuses '..'
    (ENOENT: the dentry is outside the part of the filesystem its bind mount shows)."""
    cur = dir_fd
    try:
        _, dev, ino, mnt = linux.statx_identity(cur)
        while True:
            if mnt != share.facts.mount_id:
                return False
            if (dev, ino) == (share.facts.dev, share.facts.ino):
                return True
            try:
                parent = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=cur)
            except OSError:
                return False
            if cur != dir_fd:
                os.close(cur)
            cur = parent
            identity = linux.statx_identity(cur)[1:]
            if identity == (dev, ino, mnt):
                return False  # '..' of a root is itself: the walk went past everything
            dev, ino, mnt = identity
    finally:
        if cur != dir_fd:
            os.close(cur)


def _file_inside(share: Share, obj_fd: int) -> bool:
    """A non-directory is inside when its parent directory (the dentry's, as the lookup
    found it) is. The parent comes from the kernel's connectable handle of the file, which
    encodes it, for the filesystems whose layout is the kernel's generic one (ext4, xfs and
    others); elsewhere the path string decides, and a path too long to print is EOPNOTSUPP
    (virtiofsd then keeps its own O_PATH fd)."""
    parent = _parent_dir(share, obj_fd)
    if parent is not None:
        try:
            return _dir_inside(share, parent)
        finally:
            os.close(parent)
    try:
        path, root = fd_path(obj_fd), share.current_path()
    except OSError as exc:
        # the errno's text only (no fd number), of the few errnos the table names: the
        # audit reason is the same words on both data planes and one metrics label
        unverifiable = refusals.PLACE_UNVERIFIABLE
        raise SyscallError.refusing(unverifiable,
                                    strerror=unverifiable.strerror(exc.errno or 0)) from None
    return is_below(_strip_deleted(path), root)


# generic exportfs layouts (include/linux/exportfs.h): type of a file-with-parent handle ->
# (type of the parent's own handle, where its bytes are in the file's handle)
_PARENT_LAYOUTS: dict[int, tuple[int, slice]] = {
    # ino, gen, parent ino, parent gen
    kernel.FILEID_INO32_GEN_PARENT: (kernel.FILEID_INO32_GEN, slice(8, 16)),
    # xfs's 64-bit: ino64, gen, parent ino64, parent gen
    kernel.FILEID_INO64_GEN_PARENT: (kernel.FILEID_INO64_GEN, slice(12, 24)),
}


def _parent_dir(share: Share, obj_fd: int) -> int | None:
    """An O_PATH fd of the directory a non-directory's dentry hangs from, or None."""
    try:
        handle_type, f_handle, _ = linux.name_to_handle_at(
            kernel.AT_FDCWD, f"/proc/self/fd/{obj_fd}".encode(),
            kernel.AT_HANDLE_CONNECTABLE | kernel.AT_SYMLINK_FOLLOW)
    except OSError:
        return None  # no connectable handles here, or a disconnected dentry
    layout = _PARENT_LAYOUTS.get(handle_type & ~kernel.FILEID_USER_FLAGS_MASK)
    if layout is None or len(f_handle) < layout[1].stop:
        return None
    try:
        return linux.open_by_handle_at(share.dir_fd, layout[0], f_handle[layout[1]],
                                       os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError:
        return None


def _strip_deleted(path: str) -> str:
    return path[: -len(" (deleted)")] if path.endswith(" (deleted)") else path


def chmod_would_succeed(fd: int, fsuid: int) -> bool:
    """Whether chmod(2) by a caller with this fsuid would pass every check the kernel makes
    that fhmon can see (fs/attr.c and fs/open.c): the caller owns the inode (as the share's
    mount shows it), neither the mount nor the superblock is read-only (EROFS), the inode
    is neither immutable nor append-only (EPERM), and the filesystem keeps the modes it is
    given (a list of local ones: NFS servers, FUSE, vfat and others may refuse or ignore a
    chmod). What fhmon cannot see (an LSM that would refuse this chmod) is not consulted:
    docs/semantics.md. Fails closed on any error."""
    try:
        if os.fstat(fd).st_uid != fsuid:
            return False
        f_type, _, f_flags = linux.fstatfs(fd)
        if f_flags & os.ST_RDONLY or f_type not in _CHMOD_KEEPING_FILESYSTEMS:
            return False
    except OSError:
        return False
    if fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_PATH:
        return True  # the attribute flags need an open file: asked again on the real fd
    attributes = array.array("i", [0])
    try:
        fcntl.ioctl(fd, kernel.FS_IOC_GETFLAGS, attributes, True)
    except OSError as exc:
        return exc.errno in (errno.ENOTTY, errno.EOPNOTSUPP)  # no such flags at all
    return not attributes[0] & (kernel.FS_IMMUTABLE_FL | kernel.FS_APPEND_FL)


# statfs f_type of local filesystems whose chmod by the owner always takes
_CHMOD_KEEPING_FILESYSTEMS = frozenset({
    kernel.EXT4_SUPER_MAGIC,  # ext2, ext3, ext4
    kernel.XFS_SUPER_MAGIC,
    kernel.BTRFS_SUPER_MAGIC,
    kernel.TMPFS_MAGIC,
    kernel.F2FS_SUPER_MAGIC,
})
