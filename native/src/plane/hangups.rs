//! The hang-up watcher: one thread for every target, told by poll(events = 0) when no task
//! uses a target's filter any more (POLLHUP); each hang-up is reported once, then left to
//! remove(). Once a second it also sweeps every target's thread cache.
//!
//! Reference: monitor/plane/answer_loop.py (the Python plane's loop reports its hang-ups
//! from the same epoll wait that receives its calls).

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::sys;

use super::Plane;
use super::spare::lock;
use super::target::Target;

/// No task uses the target's filter any more (poll reports POLLHUP).
pub(super) fn listener_hung_up(target: &Target) -> bool {
    let mut fds = [libc::pollfd {
        fd: AsRawFd::as_raw_fd(&target.listener),
        events: 0,
        revents: 0,
    }];
    matches!(sys::poll_many(&mut fds, 0), Ok(n) if n > 0)
        && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// One thread for every target's hang-up: poll(events = 0) reports POLLHUP once no task
/// uses a filter; each is reported once, then left to remove(). It also sweeps the thread
/// caches.
pub(super) fn watch_hangups(plane: Weak<Plane>) {
    sys::block_signals_but_wake();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    let mut ids: Vec<(u64, Arc<Target>)> = Vec::new();
    let mut swept = Instant::now();
    loop {
        let Some(p) = plane.upgrade() else { return };
        if p.is_stopped() {
            return;
        }
        if swept.elapsed() >= Duration::from_secs(1) {
            // forget exited threads' pidfds once a second (ThreadCache.sweep)
            swept = Instant::now();
            for running in lock(&p.targets).iter() {
                lock(&running.target.threads).sweep();
            }
        }
        fds.clear();
        ids.clear();
        for running in lock(&p.targets).iter() {
            if !running.target.hung_up.load(Ordering::SeqCst) {
                ids.push((running.target.id, Arc::clone(&running.target)));
            }
        }
        for (_, t) in &ids {
            fds.push(libc::pollfd {
                fd: AsRawFd::as_raw_fd(&t.listener),
                events: 0,
                revents: 0,
            });
        }
        drop(p);
        // a short timeout picks up targets added meanwhile
        let ready = sys::poll_many(&mut fds, 20).unwrap_or(0);
        if ready == 0 {
            continue;
        }
        let Some(p) = plane.upgrade() else { return };
        for (i, pfd) in fds.iter().enumerate() {
            if pfd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
                let (id, target) = &ids[i];
                if !target.hung_up.swap(true, Ordering::SeqCst) {
                    (p.hang_up)(*id);
                }
            }
        }
    }
}
