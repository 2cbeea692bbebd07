//! Who is calling: the calling thread's credentials (/proc/TID/status, cached while they
//! are frozen) and Answerer's uid check for targets an unprivileged client registered.
//! A Call reaches both through its status memo (call.rs Call::status, owned_by_peer).

use std::os::fd::AsFd;
use std::sync::Arc;

use crate::abi::Notification;
use crate::status::Status;
use crate::sys;

use super::outcome::{Outcome, resource_or_gone};
use super::spare::lock;
use super::target::Target;
use super::thread_cache::remember;

/// TargetThread.status: the thread's credentials, from the cache while they are frozen
/// and its pidfd's thread lives, else read from /proc (a new pidfd opened first: the
/// ID_VALID after the read proves it names the caller). Memoised for the call.
pub(super) fn thread_status(
    target: &Target,
    n: &Notification,
    memo: &mut Option<Arc<Status>>,
) -> Result<Arc<Status>, Outcome> {
    if let Some(status) = memo {
        return Ok(Arc::clone(status));
    }
    let mut cache = lock(&target.threads);
    let mut have_live = false;
    if let Some(e) = cache.get(n.pid) {
        if sys::pidfd_alive(e.pidfd.as_fd()) {
            if let Some(status) = &e.frozen {
                *memo = Some(Arc::clone(status));
                return Ok(Arc::clone(status));
            }
            have_live = true;
        }
    }
    let pidfd = if have_live {
        None
    } else {
        sys::pidfd_open(n.pid as i32, sys::PIDFD_THREAD).ok()
    };
    let mut buf = [0u8; 8192];
    let len = sys::read_proc_status(n.pid, &mut buf).map_err(|e| resource_or_gone(target, n, e))?;
    if !matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true)) {
        return Err(Outcome::Gone);
    }
    let Some(mut status) = crate::status::parse(&buf[..len]) else {
        return Err(Outcome::Gone);
    };
    if !in_our_user_ns(n.pid) {
        status.creds.cap_effective = 0; // no capability over fhmon's files
    }
    status.frozen = status.frozen && status.creds.cap_effective == 0;
    let status = Arc::new(status);
    let frozen = status.frozen.then(|| Arc::clone(&status));
    match pidfd {
        Some(pidfd) => remember(&mut cache, n.pid, pidfd, frozen),
        None => {
            if let Some(e) = cache.get_mut(n.pid) {
                e.frozen = frozen;
            }
        }
    }
    *memo = Some(Arc::clone(&status));
    Ok(status)
}

fn in_our_user_ns(tid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata("/proc/self/ns/user").map(|m| (m.dev(), m.ino()));
    let theirs = std::fs::metadata(format!("/proc/{tid}/ns/user")).map(|m| (m.dev(), m.ino()));
    matches!((ours, theirs), (Ok(a), Ok(b)) if a == b)
}

/// monitor/handlers/caller_uid.py: a target registered by an unprivileged client is served
/// only for threads of that client's uid. Ok(false): another uid (the reference answers
/// EPERM and audits it); Err(Gone): the thread went away.
pub(super) fn owned_by_peer(
    target: &Target,
    n: &Notification,
    memo: &mut Option<Arc<Status>>,
) -> Result<bool, Outcome> {
    if target.peer_uid == 0 {
        return Ok(true);
    }
    Ok(thread_status(target, n, memo)?.uid == target.peer_uid)
}
