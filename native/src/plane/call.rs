//! One trapped call as its handler sees it (`Call`): the target, the notification, the
//! serving thread's credentials baseline, and the caller's credentials once read; and what
//! every call is handled with (`Settings`). answer.rs makes a Call for each notification
//! and hands it to n2h::answer or obh::answer.
//!
//! Reference: monitor/handlers/base.py CallContext (with the per-call memo of
//! monitor/plane/target_thread.py TargetThread.status).

use std::os::fd::AsFd;
use std::sync::{Arc, RwLock};

use crate::abi::Notification;
use crate::creds::Baseline;
use crate::mac::KeyRing;
use crate::status::Status;
use crate::sys;

use super::caller;
use super::outcome::Outcome;
use super::target::Target;

/// The plane's part of every call: the same for all of them.
pub(super) struct Settings {
    /// the name_to_handle_at flags served (any other: EINVAL)
    pub(super) accepted_flags: i32,
    /// handles carry a MAC trailer: signed by name_to_handle_at, verified by open_by_handle_at
    pub(super) signing: bool,
    keys: RwLock<Option<Arc<KeyRing>>>,
    /// fhmon's own root: (st_dev, st_ino, unique mount id)
    pub(super) our_root: Option<(u64, u64, u64)>,
}

impl Settings {
    /// No keys yet (set_keys); fhmon's own root measured now.
    pub(super) fn new(accepted_flags: i32, signing: bool) -> Settings {
        Settings {
            accepted_flags,
            signing,
            keys: RwLock::new(None),
            our_root: sys::open_path(c"/").ok().and_then(|fd| {
                let (dev, ino) = sys::fstat_dev_ino(fd.as_fd()).ok()?;
                let (_, mnt) = sys::statx_mode_mount(fd.as_fd()).ok()?;
                Some((dev, ino, mnt))
            }),
        }
    }

    /// The ring the coming calls sign and verify with (a reload swaps it).
    pub(super) fn set_keys(&self, ring: Arc<KeyRing>) {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(ring);
    }

    fn keys(&self) -> Option<Arc<KeyRing>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// One call: made for a notification, dropped when it is answered.
pub(super) struct Call<'a> {
    pub(super) target: &'a Target,
    pub(super) notif: &'a Notification,
    /// the serving thread's own credentials, which a handler acts from and returns to
    /// (creds::ActingAs); None if they could not be measured: what needs them is deferred
    pub(super) base: Option<&'a Baseline>,
    pub(super) settings: &'a Settings,
    /// the caller's credentials once read: at most one read per call
    status: Option<Arc<Status>>,
}

impl<'a> Call<'a> {
    pub(super) fn new(
        target: &'a Target,
        notif: &'a Notification,
        base: Option<&'a Baseline>,
        settings: &'a Settings,
    ) -> Call<'a> {
        Call {
            target,
            notif,
            base,
            settings,
            status: None,
        }
    }

    /// The key ring now (read when a handle is signed or verified, not before).
    pub(super) fn keys(&self) -> Option<Arc<KeyRing>> {
        self.settings.keys()
    }

    /// The caller's credentials (caller.rs thread_status), read at most once a call.
    pub(super) fn status(&mut self) -> Result<Arc<Status>, Outcome> {
        caller::thread_status(self.target, self.notif, &mut self.status)
    }

    /// The uid check (caller.rs owned_by_peer).
    pub(super) fn owned_by_peer(&mut self) -> Result<bool, Outcome> {
        caller::owned_by_peer(self.target, self.notif, &mut self.status)
    }
}
