//! Per target: each calling thread's pidfd and, while they cannot change, its credentials
//! (saves a pidfd_open and a /proc read per call), and the target's last mount_fd
//! (`MountFdMemo`). A TID names the same thread for as long as it lives, so an entry whose
//! pidfd's thread still lives names the notifying thread; every use of an entry's pidfd
//! happens under the cache's lock, since the once-a-second sweep (plane/hangups.rs) closes
//! the pidfds of threads that exited.
//!
//! Reference: monitor/plane/thread_cache.py ThreadCache.

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;

use crate::status::Status;
use crate::sys;

/// The most pidfds a target's thread cache holds (Config::pidfds_per_target is at most this).
pub const PIDFD_CACHE: usize = 1024;

/// A thread of the target seen before: its pidfd (which names that thread for as long as
/// it lives: a live pidfd's TID is the notifying thread's) and its real uid once its
/// credentials are known to be frozen, or fixed until an execve (`frozen.frozen` false: a
/// thread without no_new_privs, checked on each use by caller.rs unchanged_since_read)
/// (monitor/plane/thread_cache.py ThreadCache).
pub(super) struct ThreadEntry {
    pub(super) pidfd: OwnedFd,
    pub(super) frozen: Option<Arc<Status>>,
}

/// A target's threads by TID: O(1) lookups, at most `limit` entries (a pidfd each), its
/// table allocated once when the target is added (an insert below the reserved capacity
/// never allocates; a full cache takes no new entry).
pub(super) struct ThreadCache {
    entries: HashMap<u32, ThreadEntry>,
    limit: usize,
}

impl ThreadCache {
    pub(super) fn new(limit: usize) -> ThreadCache {
        let limit = limit.clamp(1, PIDFD_CACHE);
        ThreadCache {
            entries: HashMap::with_capacity(limit),
            limit,
        }
    }

    pub(super) fn get(&self, tid: u32) -> Option<&ThreadEntry> {
        self.entries.get(&tid)
    }

    pub(super) fn get_mut(&mut self, tid: u32) -> Option<&mut ThreadEntry> {
        self.entries.get_mut(&tid)
    }

    pub(super) fn forget(&mut self, tid: u32) {
        self.entries.remove(&tid);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The once-a-second sweep (ThreadCache.sweep): forget the threads that exited,
    /// closing their pidfds, which makes room in a full cache.
    pub(super) fn sweep(&mut self) {
        self.retain(|e| sys::pidfd_alive(e.pidfd.as_fd()));
    }

    /// Keep the entries `keep` says yes to.
    fn retain(&mut self, mut keep: impl FnMut(&ThreadEntry) -> bool) {
        self.entries.retain(|_, e| keep(e));
    }
}

/// The target's last mount_fd (its number, our duplicate, its st_dev; our pid for kcmp),
/// as the reference's ThreadCache.mount_fd: virtiofsd passes the same mount_fd to every
/// open_by_handle_at, and an open file's st_dev and O_PATH-ness never change, so one kcmp
/// that finds the target's fd still that open file answers what pidfd_getfd, F_GETFL,
/// fstat and close would. Only fds on the share's filesystem are kept (their last close,
/// once the target closed its copy, cannot linger the way a socket's can).
pub(super) struct MountFdMemo {
    pub(super) fd: i32,
    pub(super) ours: OwnedFd,
    pub(super) dev: u64,
    pub(super) our_pid: i32,
}

/// Cache a thread's pidfd. A full cache takes no new entry (the pidfd is closed when it
/// drops): it never probes its entries on a put, which made every call of a target with
/// thousands of threads cost a pidfd_alive per cached thread (a neighbour's p50 went 12x,
/// bench/thread_cache.py; as the reference's ThreadCache.put); the once-a-second sweep
/// makes room when threads exit.
pub(super) fn remember(
    cache: &mut ThreadCache,
    tid: u32,
    pidfd: OwnedFd,
    frozen: Option<Arc<Status>>,
) {
    cache.forget(tid);
    if cache.len() < cache.limit {
        cache.entries.insert(tid, ThreadEntry { pidfd, frozen });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pidfd() -> OwnedFd {
        sys::pidfd_open(std::process::id() as i32, 0).expect("pidfd_open of ourselves")
    }

    #[test]
    fn the_thread_cache_finds_by_tid_and_takes_no_entry_when_full() {
        let mut cache = ThreadCache::new(PIDFD_CACHE);
        let reserved = cache.entries.capacity();
        assert!(reserved >= PIDFD_CACHE);
        for tid in 0..PIDFD_CACHE as u32 {
            remember(&mut cache, tid, pidfd(), None);
        }
        assert_eq!(cache.len(), PIDFD_CACHE);
        remember(&mut cache, 99_999, pidfd(), None); // full: not taken
        assert!(cache.get(99_999).is_none());
        assert!(cache.get(5).is_some());
        remember(&mut cache, 5, pidfd(), None); // a known TID replaces its own entry
        assert_eq!(cache.len(), PIDFD_CACHE);
        cache.forget(5);
        remember(&mut cache, 99_999, pidfd(), None); // room made: taken
        assert!(cache.get(99_999).is_some() && cache.get(5).is_none());
        // churn at the limit: the table never grows past what was reserved at its worst
        for round in 0..4u32 {
            for tid in 0..PIDFD_CACHE as u32 / 2 {
                cache.forget(tid + round * 100_000);
                remember(&mut cache, tid + (round + 1) * 100_000, pidfd(), None);
            }
        }
        assert!(cache.entries.capacity() <= 2 * reserved + 1);
        cache.retain(|_| false);
        assert_eq!(cache.len(), 0);
    }

    #[test]
    fn the_thread_cache_keeps_to_its_share_of_the_fd_limit() {
        let mut cache = ThreadCache::new(16);
        for tid in 0..40 {
            remember(&mut cache, tid, pidfd(), None);
        }
        assert_eq!(cache.len(), 16); // the other pidfds were closed, not kept
        assert_eq!(ThreadCache::new(0).limit, 1);
        assert_eq!(ThreadCache::new(1 << 20).limit, PIDFD_CACHE);
    }
}
