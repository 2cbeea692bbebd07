//! Inside-the-share checks and the O_PATH fallback's chmod rule, ported from
//! monitor/policy.py (check_resolved, check_opened, _dir_inside, _file_inside, _parent_dir,
//! chmod_would_succeed), errno for errno and reason for reason (both from the one table of
//! refusals, crate::refusals), kept in this one module so that a change of policy lands in
//! one place.
//!
//! "Inside" is decided on fds, never on path strings alone: walking '..' from the object (a
//! directory, or a file's parent directory) must meet the share root (its st_dev and st_ino
//! on the share's mount) before it leaves that mount or tops out; the kernel answers ENOENT
//! for '..' of a dentry that a bind mount of a subdirectory does not show. Only a share that
//! covers its whole filesystem (`whole_fs`, decided by Python at registration: pin_share)
//! skips the walk. No path has to fit in PATH_MAX, and no allocation happens per call (but
//! once per directory the memo remembers). A file's directory that an earlier walk found
//! inside, and that nothing has moved since, is not walked again (crate::inside_memo).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::abi::{self, FS_APPEND_FL, FS_IMMUTABLE_FL, ST_RDONLY};
use crate::handle::MAX_HANDLE_SZ;
use crate::inside_memo::{DirKey, InsideMemo, Walk};
use crate::refusals::{self, Entry};
use crate::sys::{self, Errno};

pub use crate::abi::PATH_MAX;

/// A refused call: the errno the target gets and the reason the audit log records (the
/// table's, as monitor/policy.py gives them), or a failure of fhmon's own syscalls (the reference's
/// "handler failed": EIO, or the resource errno itself), which has no reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub errno: i32,
    pub reason: Option<&'static str>,
}

/// A refusal of the table (crate::refusals) whose reason has no variable parts.
pub fn refused(entry: &Entry) -> Refusal {
    Refusal {
        errno: entry.errno,
        reason: Some(entry.text()),
    }
}

/// An OSError the reference does not catch: monitor/handlers/registry.py answers the
/// resource errnos as they are (monitor/plane/target_thread.py RESOURCE_ERRNOS), anything
/// else EIO.
pub fn failed(errno: Errno) -> Refusal {
    let errno = match errno {
        libc::EMFILE | libc::ENFILE | libc::ENOMEM => errno,
        _ => libc::EIO,
    };
    Refusal {
        errno,
        reason: None,
    }
}

/// What the checks need about a share, fixed at registration: the mirror of the fields of
/// protocol/share.py ShareFacts that the checks read (Python's is the one type of a share's
/// facts; tests/unit/test_share_facts.py holds this mirror to it, through PyShareRoot).
#[derive(Clone, Copy, Debug)]
pub struct ShareFacts {
    /// unique mount id of the share root
    pub mount_id: u64,
    pub dev: u64,
    pub ino: u64,
    /// the share root is the root of a mount that shows its (local) filesystem's root:
    /// every inode a handle can name there is inside the share
    pub whole_fs: bool,
}

/// A share as the checks see it: its facts and its pinned root (an O_PATH fd for paths, an
/// O_RDONLY directory fd that serves as mount_fd for a parent's handle).
#[derive(Clone, Copy)]
pub struct ShareRoot<'a> {
    pub facts: &'a ShareFacts,
    pub path_fd: BorrowedFd<'a>,
    pub dir_fd: BorrowedFd<'a>,
    /// the directories already walked to the root (crate::inside_memo)
    pub memo: &'a InsideMemo,
}

/// policy.is_below: path is root or lies under it (by path string).
pub fn is_below(path: &[u8], root: &[u8]) -> bool {
    let mut root = root;
    while let [rest @ .., b'/'] = root {
        root = rest;
    }
    root.is_empty()
        || path == root
        || (path.len() > root.len() && path.starts_with(root) && path[root.len()] == b'/')
}

/// policy._strip_deleted: the " (deleted)" suffix of an unlinked object's link.
pub fn strip_deleted(path: &[u8]) -> &[u8] {
    path.strip_suffix(b" (deleted)").unwrap_or(path)
}

/// What statx tells about an object (sys::statx_identity): st_mode, st_dev, st_ino and
/// its unique mount id. None of them changes while an fd holds the object, so one statx
/// serves both the type check and the first level of the walk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    pub mode: u32,
    pub dev: u64,
    pub ino: u64,
    pub mount_id: u64,
}

impl Identity {
    pub fn of(fd: BorrowedFd<'_>) -> Result<Identity, Errno> {
        let (mode, dev, ino, mount_id) = sys::statx_identity(fd)?;
        Ok(Identity {
            mode,
            dev,
            ino,
            mount_id,
        })
    }

    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
}

/// For name_to_handle_at: the looked-up object (its fd and its identity) must be inside
/// the share. EOPNOTSUPP for a submount inside the share and for a file whose place
/// cannot be checked; EACCES for anything outside the share.
pub fn check_resolved(
    share: &ShareRoot<'_>,
    obj: BorrowedFd<'_>,
    id: &Identity,
) -> Result<(), Refusal> {
    if id.mount_id != share.facts.mount_id {
        let mut obj_buf = [0u8; PATH_MAX];
        let mut share_buf = [0u8; PATH_MAX];
        // too deep to print: outside for this answer, refused either way
        let on_submount = match (
            sys::fd_path(obj, &mut obj_buf),
            sys::fd_path(share.path_fd, &mut share_buf),
        ) {
            (Ok(path), Ok(root)) => is_below(path, root),
            _ => false,
        };
        if on_submount {
            return Err(refused(&refusals::SUBMOUNT));
        }
        return Err(refused(&refusals::OUTSIDE_SHARE_MOUNT));
    }
    if share.facts.whole_fs {
        return Ok(());
    }
    let inside = if id.is_dir() {
        dir_inside_from(share.facts, obj, id, None)
    } else {
        file_inside(share, obj)
    }?;
    if !inside {
        return Err(refused(&refusals::OUTSIDE_SHARE));
    }
    Ok(())
}

/// For open_by_handle_at: the object must be on the share's mount; a directory of a share
/// that does not cover its whole filesystem must still be inside it (directories are
/// connected; non-directories are trusted on their MAC, like NFS no_subtree_check).
pub fn check_opened(
    share: &ShareRoot<'_>,
    obj: BorrowedFd<'_>,
    id: &Identity,
) -> Result<(), Refusal> {
    if id.mount_id != share.facts.mount_id {
        return Err(refused(&refusals::OPENED_OUTSIDE_MOUNT));
    }
    if share.facts.whole_fs || !id.is_dir() {
        return Ok(());
    }
    if !dir_inside_from(share.facts, obj, id, None)? {
        return Err(refused(&refusals::DIRECTORY_LEFT_SHARE));
    }
    Ok(())
}

/// policy._dir_inside: walk '..' from a directory fd; inside when the walk meets the share
/// root (same inode on the share's mount) before it leaves that mount, tops out, or the
/// kernel refuses '..'. Err: a statx failed (the reference lets that OSError through).
pub fn dir_inside(share: &ShareFacts, dir: BorrowedFd<'_>) -> Result<bool, Refusal> {
    let id = Identity::of(dir).map_err(failed)?;
    dir_inside_from(share, dir, &id, None)
}

/// dir_inside for a directory whose identity the caller's own statx of `dir` gave (the
/// share root itself then costs no further syscall); with a memo's walk, each directory
/// is watched before the walk climbs above it.
fn dir_inside_from(
    share: &ShareFacts,
    dir: BorrowedFd<'_>,
    id: &Identity,
    mut walk: Option<&mut Walk<'_>>,
) -> Result<bool, Refusal> {
    let (mut dev, mut ino, mut mnt) = (id.dev, id.ino, id.mount_id);
    let mut cur: Option<OwnedFd> = None;
    loop {
        if mnt != share.mount_id {
            return Ok(false);
        }
        if (dev, ino) == (share.dev, share.ino) {
            return Ok(true);
        }
        let at = cur.as_ref().map_or(dir, |fd| fd.as_fd());
        if let Some(walk) = walk.as_deref_mut() {
            walk.watch(at);
        }
        let Ok(parent) = sys::open_parent(at) else {
            return Ok(false);
        };
        let (_, pdev, pino, pmnt) = sys::statx_identity(parent.as_fd()).map_err(failed)?;
        cur = Some(parent); // the previous level's fd is closed here
        if (pdev, pino, pmnt) == (dev, ino, mnt) {
            return Ok(false); // '..' of a root is itself: the walk went past everything
        }
        (dev, ino, mnt) = (pdev, pino, pmnt);
    }
}

/// policy._file_inside: a non-directory is inside when its parent directory (from its
/// connectable handle, on the generic exportfs layouts) is; elsewhere the printed path
/// decides, and one that does not print is EOPNOTSUPP (virtiofsd keeps its O_PATH fd).
/// A parent the memo holds is inside without being opened or walked.
fn file_inside(share: &ShareRoot<'_>, obj: BorrowedFd<'_>) -> Result<bool, Refusal> {
    if let Some(parent) = ParentHandle::of(obj) {
        let key = DirKey::new(parent.handle_type, parent.bytes());
        if key.as_ref().is_some_and(|key| share.memo.holds(key)) {
            return Ok(true);
        }
        if let Some(dir) = parent.open(share) {
            let id = Identity::of(dir.as_fd()).map_err(failed)?;
            let mut walk = share.memo.begin();
            let inside = dir_inside_from(share.facts, dir.as_fd(), &id, walk.as_mut())?;
            if let (true, Some(walk), Some(key)) = (inside, walk, key) {
                walk.remember(&key);
            }
            return Ok(inside);
        }
    }
    let mut obj_buf = [0u8; PATH_MAX];
    let mut share_buf = [0u8; PATH_MAX];
    let path = sys::fd_path(obj, &mut obj_buf).map_err(unverifiable)?;
    let root = sys::fd_path(share.path_fd, &mut share_buf).map_err(unverifiable)?;
    Ok(is_below(strip_deleted(path), root))
}

/// The table's place_unverifiable, with the text of the errno that stopped the check (of
/// the few the table names: the same words as monitor/policy.py, and no fd number).
fn unverifiable(errno: Errno) -> Refusal {
    let entry = &refusals::PLACE_UNVERIFIABLE;
    Refusal {
        errno: entry.errno,
        reason: Some(entry.with_strerror(errno)),
    }
}

/// policy._PARENT_LAYOUTS: for a file-with-parent handle type of the kernel's generic
/// exportfs layouts (include/linux/exportfs.h), the type of the parent's own handle and
/// where its bytes lie in the file's handle.
pub fn parent_layout(handle_type: i32) -> Option<(i32, std::ops::Range<usize>)> {
    use crate::abi::{
        FILEID_INO32_GEN, FILEID_INO32_GEN_PARENT, FILEID_INO64_GEN, FILEID_INO64_GEN_PARENT,
        FILEID_USER_FLAGS_MASK,
    };
    match (handle_type as u32 & !FILEID_USER_FLAGS_MASK) as i32 {
        // ino, gen, parent ino, gen
        FILEID_INO32_GEN_PARENT => Some((FILEID_INO32_GEN, 8..16)),
        // xfs's 64-bit: ino64, gen, parent ino64, parent gen
        FILEID_INO64_GEN_PARENT => Some((FILEID_INO64_GEN, 12..24)),
        _ => None,
    }
}

/// The handle of the directory a non-directory's dentry hangs from: the parent part of the
/// object's connectable handle (policy._parent_dir before it opens it).
struct ParentHandle {
    handle_type: i32,
    bytes: [u8; MAX_HANDLE_SZ],
    at: std::ops::Range<usize>,
}

impl ParentHandle {
    /// None: no connectable handles here, a disconnected dentry, or not a generic layout.
    fn of(obj: BorrowedFd<'_>) -> Option<ParentHandle> {
        let mut bytes = [0u8; MAX_HANDLE_SZ];
        let flags = abi::AT_HANDLE_CONNECTABLE | abi::AT_SYMLINK_FOLLOW;
        let (handle_type, len, _) = sys::name_to_handle_at_of_fd(obj, flags, &mut bytes).ok()?;
        let (parent_type, at) = parent_layout(handle_type)?;
        if len < at.end {
            return None;
        }
        Some(ParentHandle {
            handle_type: parent_type,
            bytes,
            at,
        })
    }

    fn bytes(&self) -> &[u8] {
        &self.bytes[self.at.clone()]
    }

    /// An O_PATH fd of the directory itself.
    fn open(&self, share: &ShareRoot<'_>) -> Option<OwnedFd> {
        let flags = libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC;
        sys::open_by_handle_at(share.dir_fd, self.handle_type, self.bytes(), flags).ok()
    }
}

/// statfs f_type of local filesystems whose chmod by the owner always takes
/// (monitor/policy.py _CHMOD_KEEPING_FILESYSTEMS).
const CHMOD_KEEPING_FILESYSTEMS: [i64; 5] = [
    abi::EXT4_SUPER_MAGIC,
    abi::XFS_SUPER_MAGIC,
    abi::BTRFS_SUPER_MAGIC,
    abi::TMPFS_MAGIC,
    abi::F2FS_SUPER_MAGIC,
];

/// monitor/policy.py chmod_would_succeed: whether chmod(2) by a caller with this fsuid
/// would pass every check the kernel makes that fhmon can see: the caller owns the inode,
/// neither the mount nor the superblock is read-only, the inode is neither immutable nor
/// append-only (asked only on a real open file: an O_PATH fd answers true here and is
/// asked again once reopened), and the filesystem keeps the modes it is given. Fails
/// closed on any error but "this filesystem has no such flags".
pub fn chmod_would_succeed(fd: BorrowedFd<'_>, fsuid: u32) -> bool {
    match sys::fstat_dev_uid(fd) {
        Ok((_, uid)) if uid == fsuid => {}
        _ => return false,
    }
    match sys::fstatfs_type_flags(fd) {
        Ok((f_type, f_flags))
            if f_flags & ST_RDONLY == 0 && CHMOD_KEEPING_FILESYSTEMS.contains(&f_type) => {}
        _ => return false,
    }
    match sys::fcntl_getfl(fd) {
        Ok(fl) if fl & libc::O_PATH != 0 => return true,
        Ok(_) => {}
        Err(_) => return false,
    }
    match sys::inode_flags(fd) {
        Ok(flags) => flags & (FS_IMMUTABLE_FL | FS_APPEND_FL) == 0,
        Err(e) => e == libc::ENOTTY || e == libc::EOPNOTSUPP, // no such flags at all
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn below_is_by_component() {
        assert!(is_below(b"/srv/share", b"/srv/share"));
        assert!(is_below(b"/srv/share/a", b"/srv/share/"));
        assert!(!is_below(b"/srv/shared", b"/srv/share"));
        assert!(is_below(b"/anything", b"/"));
        assert_eq!(strip_deleted(b"/s/a (deleted)"), b"/s/a");
    }

    #[test]
    fn parent_layouts_ignore_user_flags() {
        assert_eq!(parent_layout(2), Some((1, 8..16)));
        assert_eq!(parent_layout(0x0002_0002), Some((1, 8..16)));
        assert_eq!(parent_layout(0x82), Some((0x81, 12..24)));
        assert_eq!(parent_layout(1), None);
        assert_eq!(parent_layout(-1), None);
    }

    fn open(path: &std::path::Path) -> OwnedFd {
        std::fs::File::open(path).unwrap().into()
    }

    fn facts_of(root: BorrowedFd<'_>) -> ShareFacts {
        let (_, dev, ino, mount_id) = sys::statx_identity(root).unwrap();
        ShareFacts {
            mount_id,
            dev,
            ino,
            whole_fs: false,
        }
    }

    /// On the real filesystem (the kernel is the oracle): a directory below the share is
    /// inside, its sibling and a directory moved out are not, and a walk from deeper than
    /// PATH_MAX works where a path string could not.
    #[test]
    fn the_walk_decides_on_fds() {
        let base = std::env::temp_dir().join(format!("fhmon-policy-{}", std::process::id()));
        let share = base.join("share");
        std::fs::create_dir_all(share.join("a/b")).unwrap();
        std::fs::create_dir_all(base.join("other")).unwrap();
        std::fs::write(share.join("a/file"), b"x").unwrap();
        let root = open(&share);
        let facts = facts_of(root.as_fd());
        let memo = InsideMemo::watching();
        let root_view = ShareRoot {
            facts: &facts,
            path_fd: root.as_fd(),
            dir_fd: root.as_fd(),
            memo: &memo,
        };
        let b = open(&share.join("a/b"));
        assert_eq!(dir_inside(&facts, b.as_fd()), Ok(true));
        assert_eq!(dir_inside(&facts, root.as_fd()), Ok(true));
        let other = open(&base.join("other"));
        assert_eq!(dir_inside(&facts, other.as_fd()), Ok(false));
        let other_id = Identity::of(other.as_fd()).unwrap();
        assert_eq!(
            check_resolved(&root_view, other.as_fd(), &other_id),
            Err(refused(&refusals::OUTSIDE_SHARE))
        );
        assert_eq!(
            check_opened(&root_view, other.as_fd(), &other_id),
            Err(refused(&refusals::DIRECTORY_LEFT_SHARE))
        );
        let file = open(&share.join("a/file"));
        let file_id = Identity::of(file.as_fd()).unwrap();
        // a non-directory off the share's subtree passes check_opened (trusted on its MAC)
        std::fs::write(base.join("other/file"), b"y").unwrap();
        let outside_file = open(&base.join("other/file"));
        let outside_id = Identity::of(outside_file.as_fd()).unwrap();
        assert_eq!(
            check_opened(&root_view, outside_file.as_fd(), &outside_id),
            Ok(())
        );
        assert_eq!(check_resolved(&root_view, file.as_fd(), &file_id), Ok(()));
        // the second time from the memo (a/ walked once), with the same answer
        assert_eq!(memo.len(), 1, "the walk of a/ is remembered");
        assert_eq!(check_resolved(&root_view, file.as_fd(), &file_id), Ok(()));
        // moved out: the same fd is now outside, memo or not
        std::fs::rename(share.join("a"), base.join("other/a")).unwrap();
        assert_eq!(dir_inside(&facts, b.as_fd()), Ok(false));
        assert_eq!(
            check_resolved(&root_view, file.as_fd(), &file_id),
            Err(refused(&refusals::OUTSIDE_SHARE))
        );
        // deeper than PATH_MAX, built by fd (a path string would not fit)
        let name = "d".repeat(200);
        let mut deep = open(&share);
        for _ in 0..25 {
            std::fs::create_dir(format!("/proc/self/fd/{}/{name}", {
                use std::os::fd::AsRawFd;
                deep.as_raw_fd()
            }))
            .unwrap();
            let next = std::fs::File::open(format!("/proc/self/fd/{}/{name}", {
                use std::os::fd::AsRawFd;
                deep.as_raw_fd()
            }))
            .unwrap();
            deep = next.into();
        }
        let mut buf = [0u8; PATH_MAX];
        assert_eq!(
            sys::fd_path(deep.as_fd(), &mut buf),
            Err(libc::ENAMETOOLONG)
        );
        assert_eq!(dir_inside(&facts, deep.as_fd()), Ok(true));
        drop(deep);
        let _ = std::process::Command::new("rm")
            .arg("-rf")
            .arg(&base)
            .status();
    }
}
