//! One target as the plane serves it: its listener and share, who registered it, and what
//! its calls share (the thread cache, the last mount_fd, the locks that serialise its
//! fallback calls and, under "auto", its work). Its calls are answered by its own threads
//! alone; the hang-up watcher polls its listener and sweeps its thread cache.

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Condvar, Mutex};

use crate::inside_memo::InsideMemo;
use crate::mac::ShareId;
use crate::policy::{ShareFacts, ShareRoot};

use super::thread_cache::{MountFdMemo, ThreadCache};

pub struct Share {
    /// signing.share_id_from_handle of the root, computed by Python at registration
    pub share_id: ShareId,
    pub dir_fd: OwnedFd,
    pub path_fd: OwnedFd,
    pub facts: ShareFacts,
    /// directories of this share already walked (disabled for a share that is a
    /// filesystem of its own: nothing is walked there)
    pub memo: InsideMemo,
}

impl Share {
    pub(super) fn root(&self) -> ShareRoot<'_> {
        ShareRoot {
            facts: &self.facts,
            path_fd: self.path_fd.as_fd(),
            dir_fd: self.dir_fd.as_fd(),
            memo: &self.memo,
        }
    }
}

pub(super) struct Target {
    pub(super) id: u64,
    pub(super) listener: OwnedFd,
    pub(super) share: Share,
    /// the registering client's uid (0: root, whose targets are any uid's)
    pub(super) peer_uid: u32,
    pub(super) stopping: AtomicBool,
    pub(super) hung_up: AtomicBool,
    pub(super) threads: Mutex<ThreadCache>,
    /// the target's last mount_fd on the share's filesystem (target_thread.rs known_mount_fd)
    pub(super) mount_fd: Mutex<Option<MountFdMemo>>,
    /// held while the Python reference answers one of its calls: one at a time
    pub(super) fallback_lock: Mutex<()>,
    /// calls answered natively since the last take_stats
    pub(super) calls: AtomicU64,
    /// where a thread parks, until stop_threads notifies it: a spare thread while it is
    /// confined to one CPU (Spare), any thread once its listener refuses RECV for good
    pub(super) spare_lock: Mutex<()>,
    pub(super) spare_wake: Condvar,
    /// under "auto", held while a thread works on a call (Spare): one CPU per target
    pub(super) work: Mutex<()>,
}

impl Target {
    /// A target not served yet, its thread cache sized at most `pidfds` entries.
    pub(super) fn new(
        id: u64,
        listener: OwnedFd,
        share: Share,
        peer_uid: u32,
        pidfds: usize,
    ) -> Target {
        Target {
            id,
            listener,
            share,
            peer_uid,
            stopping: AtomicBool::new(false),
            hung_up: AtomicBool::new(false),
            threads: Mutex::new(ThreadCache::new(pidfds)),
            mount_fd: Mutex::new(None),
            fallback_lock: Mutex::new(()),
            calls: AtomicU64::new(0),
            spare_lock: Mutex::new(()),
            spare_wake: Condvar::new(),
            work: Mutex::new(()),
        }
    }
}
