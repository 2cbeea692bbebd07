//! Inside-the-share checks, ported from monitor/policy.py (check_resolved, check_opened) as
//! they are on main, kept in this one module so that a change of policy lands in one place.
//!
//! The checks see the filesystem only through `Paths` (the /proc/self/fd links of the object
//! and of the share's pinned root), read into caller buffers: no allocation per call.

pub const PATH_MAX: usize = 4096;

/// A refused call: the errno the target gets and the reason the audit log records (the
/// same words as monitor/policy.py).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub errno: i32,
    pub reason: &'static str,
}

/// What the checks need about a share, fixed at registration.
#[derive(Clone, Copy, Debug)]
pub struct ShareFacts {
    pub mount_id: u64,
    pub is_mount_root: bool,
}

/// Where the object and the share root are now (readlink of /proc/self/fd/N).
pub trait Paths {
    fn object_path<'b>(&mut self, buf: &'b mut [u8; PATH_MAX]) -> Result<&'b [u8], i32>;
    fn share_path<'b>(&mut self, buf: &'b mut [u8; PATH_MAX]) -> Result<&'b [u8], i32>;
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

fn path_error(errno: i32) -> Refusal {
    Refusal {
        errno: if errno == 0 { libc::EIO } else { errno },
        reason: "cannot read a path from /proc/self/fd",
    }
}

/// For name_to_handle_at: the looked-up object must be inside the share. EOPNOTSUPP for a
/// submount inside the share, EACCES for anything outside it.
pub fn check_resolved(
    share: &ShareFacts,
    obj_mount_id: u64,
    paths: &mut impl Paths,
) -> Result<(), Refusal> {
    let mut obj_buf = [0u8; PATH_MAX];
    let mut share_buf = [0u8; PATH_MAX];
    if obj_mount_id != share.mount_id {
        let obj = paths.object_path(&mut obj_buf).map_err(path_error)?;
        let root = paths.share_path(&mut share_buf).map_err(path_error)?;
        if is_below(obj, root) {
            return Err(Refusal {
                errno: libc::EOPNOTSUPP,
                reason: "object on a submount inside the share",
            });
        }
        return Err(Refusal {
            errno: libc::EACCES,
            reason: "object outside the share (other mount)",
        });
    }
    if share.is_mount_root {
        return Ok(());
    }
    let obj = paths.object_path(&mut obj_buf).map_err(path_error)?;
    let root = paths.share_path(&mut share_buf).map_err(path_error)?;
    if !is_below(strip_deleted(obj), root) {
        return Err(Refusal {
            errno: libc::EACCES,
            reason: "object outside the share",
        });
    }
    Ok(())
}

/// For open_by_handle_at: the object must be on the share's mount; a directory of a share
/// that is not its mount's root must still be below the share (directories are connected;
/// non-directories are trusted on their MAC, like NFS no_subtree_check).
pub fn check_opened(
    share: &ShareFacts,
    is_dir: bool,
    obj_mount_id: u64,
    paths: &mut impl Paths,
) -> Result<(), Refusal> {
    if obj_mount_id != share.mount_id {
        return Err(Refusal {
            errno: libc::ESTALE,
            reason: "opened object not on the share's mount",
        });
    }
    if share.is_mount_root || !is_dir {
        return Ok(());
    }
    let mut obj_buf = [0u8; PATH_MAX];
    let mut share_buf = [0u8; PATH_MAX];
    let obj = paths.object_path(&mut obj_buf).map_err(path_error)?;
    let root = paths.share_path(&mut share_buf).map_err(path_error)?;
    if !is_below(obj, root) {
        return Err(Refusal {
            errno: libc::ESTALE,
            reason: "directory no longer inside the share",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Fixed(&'static [u8], &'static [u8]);

    fn fill<'b>(src: &[u8], buf: &'b mut [u8; PATH_MAX]) -> &'b [u8] {
        buf[..src.len()].copy_from_slice(src);
        &buf[..src.len()]
    }

    impl Paths for Fixed {
        fn object_path<'b>(&mut self, buf: &'b mut [u8; PATH_MAX]) -> Result<&'b [u8], i32> {
            Ok(fill(self.0, buf))
        }
        fn share_path<'b>(&mut self, buf: &'b mut [u8; PATH_MAX]) -> Result<&'b [u8], i32> {
            Ok(fill(self.1, buf))
        }
    }

    #[test]
    fn below_is_by_component() {
        assert!(is_below(b"/srv/share", b"/srv/share"));
        assert!(is_below(b"/srv/share/a", b"/srv/share/"));
        assert!(!is_below(b"/srv/shared", b"/srv/share"));
        assert!(is_below(b"/anything", b"/"));
    }

    #[test]
    fn resolved_checks_in_policy_order() {
        let share = ShareFacts {
            mount_id: 7,
            is_mount_root: false,
        };
        let mut inside = Fixed(b"/s/a", b"/s");
        assert_eq!(check_resolved(&share, 7, &mut inside), Ok(()));
        assert_eq!(
            check_resolved(&share, 8, &mut inside).unwrap_err().errno,
            libc::EOPNOTSUPP
        );
        let mut outside = Fixed(b"/t/a", b"/s");
        assert_eq!(
            check_resolved(&share, 8, &mut outside).unwrap_err().errno,
            libc::EACCES
        );
        assert_eq!(
            check_resolved(&share, 7, &mut outside).unwrap_err().reason,
            "object outside the share"
        );
        let mut deleted = Fixed(b"/s/a (deleted)", b"/s");
        assert_eq!(check_resolved(&share, 7, &mut deleted), Ok(()));
    }

    #[test]
    fn opened_trusts_non_directories() {
        let share = ShareFacts {
            mount_id: 7,
            is_mount_root: false,
        };
        let mut outside = Fixed(b"/", b"/s");
        assert_eq!(check_opened(&share, false, 7, &mut outside), Ok(()));
        assert_eq!(
            check_opened(&share, true, 7, &mut outside)
                .unwrap_err()
                .errno,
            libc::ESTALE
        );
        assert_eq!(
            check_opened(&share, false, 6, &mut outside)
                .unwrap_err()
                .errno,
            libc::ESTALE
        );
    }
}
