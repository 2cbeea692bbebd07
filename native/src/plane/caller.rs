//! Who is calling: the calling thread's credentials (/proc/TID/status, cached while they
//! are frozen, or until an execve for a thread without no_new_privs) and Answerer's uid check for targets an unprivileged client registered.
//! A Call reaches both through its status memo (call.rs Call::status, owned_by_peer).

use std::os::fd::{AsFd, BorrowedFd};
use std::sync::Arc;

use crate::abi::Notification;
use crate::status::Status;
use crate::sys;

use super::outcome::{Outcome, resource_or_gone};
use super::spare::lock;
use super::target::Target;
use super::thread_cache::remember;

/// TargetThread.status: the thread's credentials, from the cache while they are frozen
/// and its pidfd's thread lives (or, without no_new_privs, while the kernel still shows
/// them unchanged: unchanged_since_read), else read from /proc (a new pidfd opened first: the
/// ID_VALID after the read proves it names the caller). Memoised for the call.
pub(super) fn thread_status(
    target: &Target,
    n: &Notification,
    memo: &mut Option<Arc<Status>>,
) -> Result<Arc<Status>, Outcome> {
    if let Some(status) = memo {
        return Ok(Arc::clone(status));
    }
    let (have_live, before) = {
        let cache = lock(&target.threads);
        match cache.get(n.pid) {
            None => (false, None),
            Some(e) => {
                if let Some(status) = &e.frozen {
                    let still = if status.frozen {
                        sys::pidfd_alive(e.pidfd.as_fd())
                    } else {
                        unchanged_since_read(n.pid, e.pidfd.as_fd(), status)
                    };
                    if still {
                        *memo = Some(Arc::clone(status));
                        return Ok(Arc::clone(status));
                    }
                }
                let before = sys::pidfd_creds(e.pidfd.as_fd()).ok();
                (
                    before.is_some() || sys::pidfd_alive(e.pidfd.as_fd()),
                    before,
                )
            }
        }
    };
    // the cache is not locked over the read: a TID makes one call at a time, and the
    // target's other threads need not wait for this one's /proc read
    let pidfd = if have_live {
        None
    } else {
        sys::pidfd_open(n.pid as i32, sys::PIDFD_THREAD).ok()
    };
    // the kernel's ids before the read: an execve between the two shows as a difference
    let before = before.or_else(|| {
        pidfd
            .as_ref()
            .and_then(|p| sys::pidfd_creds(p.as_fd()).ok())
    });
    let mut buf = [0u8; 8192];
    let len = sys::read_proc_status(n.pid, &mut buf).map_err(|e| resource_or_gone(target, n, e))?;
    if !matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true)) {
        return Err(Outcome::Gone);
    }
    let Some(mut status) = crate::status::parse(&buf[..len]) else {
        return Err(Outcome::Gone);
    };
    let no_capability = status.creds.cap_effective == 0;
    // CapEff counts only in fhmon's own user namespace; with none, nothing to look at
    if !no_capability && !in_our_user_ns(n.pid) {
        status.creds.cap_effective = 0; // no capability over fhmon's files
    }
    status.frozen = status.frozen && status.creds.cap_effective == 0;
    // without no_new_privs, cached too, and checked against the kernel on each use
    let until_exec =
        !status.frozen && status.fixed_until_exec && no_capability && before == Some(status.ids);
    let status = Arc::new(status);
    let frozen = (status.frozen || until_exec).then(|| Arc::clone(&status));
    let mut cache = lock(&target.threads);
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

/// A thread cached without no_new_privs keeps its credentials until an execve of a
/// set-user-ID, set-group-ID or file-capability program: still no capability (capget by
/// TID) and the same eight ids (PIDFD_GET_INFO through its pidfd, which also proves that
/// the thread lived after the capget, so the TID named it). Two syscalls, against a /proc
/// read and parse per call.
fn unchanged_since_read(tid: u32, pidfd: BorrowedFd<'_>, read: &Status) -> bool {
    matches!(sys::capget_tid(tid), Ok((0, 0))) && sys::pidfd_creds(pidfd) == Ok(read.ids)
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
