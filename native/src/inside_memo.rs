//! Directories already walked to the share root, so that a name_to_handle_at of the next
//! file in the same directory costs no '..' walk (docs/performance.md, "Where each
//! microsecond goes": on a share that is not a filesystem of its own the walk was most of
//! an n2h). A directory is remembered by its own file handle (type and bytes: unique on its
//! filesystem, generation included), as the parent part of its files' connectable handles
//! names it, so a hit opens nothing.
//!
//! Every directory the walk passed is watched with inotify before the walk climbs above it,
//! and any event at all (one of them renamed or removed, by anyone, an unmount, a queue
//! overflow) forgets everything: the queue is read before every answer, so a hit is as true
//! as a walk made at that moment. A rename that lands before a watch is in place is seen by
//! the walk itself, which climbs after the watch; a walk that overlapped a forget is not
//! remembered. Without inotify (no instance to be had) nothing is remembered and every
//! call walks, as the Python reference always does.

use std::collections::HashSet;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

use crate::handle::MAX_HANDLE_SZ;
use crate::sys;

/// Directories remembered per share, and watches per inotify instance, at most: past
/// either the memo stops growing (calls walk) until the next forget, which starts a new
/// instance when the old one holds this many watches.
pub const MAX_REMEMBERED: usize = 4096;

/// inotify instances the memos of all shares hold at most: they come out of root's
/// fs.inotify.max_user_instances (128 by default), which the node's other root services
/// (the kubelet, systemd) draw on too; past it a share's calls walk.
pub const MAX_INSTANCES: usize = 32;

static INSTANCES: AtomicUsize = AtomicUsize::new(0);

/// A directory's handle as a key: its type, then its bytes.
pub struct DirKey {
    bytes: [u8; 4 + MAX_HANDLE_SZ],
    len: usize,
}

impl DirKey {
    /// None for bytes longer than a handle can be.
    pub fn new(handle_type: i32, handle: &[u8]) -> Option<DirKey> {
        if handle.len() > MAX_HANDLE_SZ {
            return None;
        }
        let mut bytes = [0u8; 4 + MAX_HANDLE_SZ];
        bytes[..4].copy_from_slice(&handle_type.to_le_bytes());
        bytes[4..4 + handle.len()].copy_from_slice(handle);
        Some(DirKey {
            bytes,
            len: 4 + handle.len(),
        })
    }

    fn as_bytes(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

struct Known {
    inotify: OwnedFd,
    watches: usize,
    /// bumped by every forget: a walk begun before one is not remembered
    generation: u64,
    dirs: HashSet<Box<[u8]>>,
}

impl Known {
    /// Read the queue; on any event forget every directory (and start a new instance once
    /// the old one is full of watches). Err: no instance could be had.
    fn catch_up(&mut self) -> Result<(), sys::Errno> {
        if !sys::drain_events(self.inotify.as_fd()) {
            return Ok(());
        }
        self.dirs.clear();
        self.generation += 1;
        if self.watches >= MAX_REMEMBERED {
            self.inotify = sys::inotify_new()?;
            self.watches = 0;
        }
        Ok(())
    }
}

/// The memo of one share (None inside: inotify unavailable, or it failed once).
pub struct InsideMemo {
    known: Mutex<Option<Known>>,
    /// counted in INSTANCES until dropped
    claimed: bool,
}

/// One walk in progress: the generation it began in, and whether each directory it
/// passed could be watched.
pub struct Walk<'m> {
    memo: &'m InsideMemo,
    generation: u64,
    watched: bool,
}

impl InsideMemo {
    /// A memo with an inotify instance of its own, if one of MAX_INSTANCES is free.
    pub fn watching() -> InsideMemo {
        if INSTANCES.fetch_add(1, Ordering::SeqCst) >= MAX_INSTANCES {
            INSTANCES.fetch_sub(1, Ordering::SeqCst);
            return InsideMemo::disabled();
        }
        let known = sys::inotify_new().ok().map(|inotify| Known {
            inotify,
            watches: 0,
            generation: 0,
            dirs: HashSet::new(),
        });
        InsideMemo {
            known: Mutex::new(known),
            claimed: true,
        }
    }

    /// A memo that never remembers: for a share that is a filesystem of its own (nothing
    /// to walk) and for checks made outside the data plane.
    pub fn disabled() -> InsideMemo {
        InsideMemo {
            known: Mutex::new(None),
            claimed: false,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Known>> {
        // a thread that panicked holding it left a consistent set (each step is whole)
        self.known
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Up to date with the queue: whether `dir` was walked to the share root and no
    /// directory watched since has moved.
    pub fn holds(&self, dir: &DirKey) -> bool {
        let mut known = self.lock();
        let Some(k) = known.as_mut() else {
            return false;
        };
        if k.catch_up().is_err() {
            *known = None;
            return false;
        }
        k.dirs.contains(dir.as_bytes())
    }

    /// Begin a walk whose directories will be watched (None: nothing will be remembered).
    pub fn begin(&self) -> Option<Walk<'_>> {
        let known = self.lock();
        let k = known.as_ref()?;
        Some(Walk {
            memo: self,
            generation: k.generation,
            watched: true,
        })
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.lock().as_ref().map_or(0, |k| k.dirs.len())
    }
}

impl Drop for InsideMemo {
    fn drop(&mut self) {
        if self.claimed {
            INSTANCES.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Walk<'_> {
    /// Watch a directory of the walk; called before the walk opens its '..'.
    pub fn watch(&mut self, dir: BorrowedFd<'_>) {
        if !self.watched {
            return;
        }
        let mut known = self.memo.lock();
        let Some(k) = known.as_mut() else {
            self.watched = false;
            return;
        };
        if k.watches >= MAX_REMEMBERED || sys::watch_moves(k.inotify.as_fd(), dir).is_err() {
            self.watched = false;
            return;
        }
        k.watches += 1;
    }

    /// The walk found `dir` inside: remember it, if every directory it passed is watched
    /// and nothing moved since it began.
    pub fn remember(self, dir: &DirKey) {
        if !self.watched {
            return;
        }
        let mut known = self.memo.lock();
        let Some(k) = known.as_mut() else {
            return;
        };
        if k.catch_up().is_err() {
            *known = None;
            return;
        }
        if k.generation == self.generation && k.dirs.len() < MAX_REMEMBERED {
            k.dirs.insert(dir.as_bytes().into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    fn open_dir(path: &std::path::Path) -> OwnedFd {
        let file = std::fs::File::open(path).expect("open dir");
        OwnedFd::from(file)
    }

    fn key(n: u8) -> DirKey {
        DirKey::new(1, &[n; 8]).expect("key")
    }

    /// The kernel as the oracle: a rename of a watched directory, or of one above it that
    /// the walk passed, forgets; a walk that a forget overlapped is not remembered.
    #[test]
    fn a_move_of_any_walked_directory_forgets() {
        let top = tempfile_dir("memo");
        let (a, b) = (top.join("a"), top.join("a/b"));
        std::fs::create_dir_all(&b).expect("mkdir");
        let memo = InsideMemo::watching();
        let remember_walk = |memo: &InsideMemo, n: u8| {
            let mut walk = memo.begin().expect("inotify");
            walk.watch(open_dir(&b).as_fd());
            walk.watch(open_dir(&a).as_fd());
            walk.remember(&key(n));
        };
        remember_walk(&memo, 1);
        assert!(memo.holds(&key(1)));
        assert!(!memo.holds(&key(2)));
        std::fs::rename(&a, top.join("a2")).expect("rename the upper one");
        assert!(
            !memo.holds(&key(1)),
            "the move of a directory above forgets"
        );
        std::fs::rename(top.join("a2"), &a).expect("back");
        memo.holds(&key(1)); // reads that move's own event
        remember_walk(&memo, 1);
        assert!(memo.holds(&key(1)));
        std::fs::rename(&b, a.join("b2")).expect("rename the lower one");
        assert!(!memo.holds(&key(1)));
        // a walk begun before a forget is not remembered
        let mut walk = memo.begin().expect("inotify");
        walk.watch(open_dir(&a.join("b2")).as_fd());
        std::fs::rename(a.join("b2"), &b).expect("rename mid-walk");
        walk.remember(&key(3));
        assert!(!memo.holds(&key(3)));
        assert_eq!(memo.len(), 0);
        std::fs::remove_dir_all(&top).expect("cleanup");
    }

    #[test]
    fn removal_forgets_and_a_disabled_memo_never_holds() {
        let top = tempfile_dir("memo-rm");
        let d = top.join("d");
        std::fs::create_dir(&d).expect("mkdir");
        let memo = InsideMemo::watching();
        let mut walk = memo.begin().expect("inotify");
        walk.watch(open_dir(&d).as_fd());
        walk.remember(&key(1));
        assert!(memo.holds(&key(1)));
        std::fs::remove_dir(&d).expect("rmdir");
        assert!(!memo.holds(&key(1)));
        let off = InsideMemo::disabled();
        assert!(off.begin().is_none());
        assert!(!off.holds(&key(1)));
        std::fs::remove_dir_all(&top).expect("cleanup");
    }

    #[test]
    fn keys_differ_by_type_and_bytes_and_refuse_oversized_handles() {
        assert_ne!(
            key(1).as_bytes(),
            DirKey::new(2, &[1; 8]).expect("key").as_bytes()
        );
        assert_ne!(
            key(1).as_bytes(),
            DirKey::new(1, &[1; 7]).expect("key").as_bytes()
        );
        assert!(DirKey::new(1, &[0; MAX_HANDLE_SZ + 1]).is_none());
    }

    fn tempfile_dir(tag: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fhmon-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("mkdir");
        dir
    }
}
