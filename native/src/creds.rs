//! Acting with a target's file-system credentials on the calling thread, as
//! monitor/credentials.py `acting_as(creds, reopen_only=True)`: per-thread raw syscalls
//! (setfsuid, setfsgid, setgroups, capset). fsuid and capabilities are always switched
//! back (a guard's Drop); fsgid and the supplementary groups are left as the last switch
//! set them (Lingering) and switched only when the next target thread's differ, because
//! nothing fhmon does itself between two switches consults them: its own calls pass on
//! capabilities (CAP_DAC_READ_SEARCH for open_by_handle_at and the '..' walk,
//! CAP_SYS_PTRACE for /proc and the target's memory), which fsgid and groups do not touch,
//! and the plane creates no file. That saves two credential commits per call (setfsgid
//! each way: 0.75 us of 8 per open_by_handle_at, `bench.run --perf obh`). The thread
//! settles back to its own (Baseline::settle) before Python code runs on it (a fallback)
//! and after a panic.

use std::cell::RefCell;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::status::Credentials;
use crate::sys;

use crate::abi::{CAP_KILL, CAP_SETGID, CAP_SETUID, CAP_SYS_PTRACE};
/// capabilities that opening a directory or regular file never consults
const OPEN_NEUTRAL_CAPS: u64 =
    1 << CAP_KILL | 1 << CAP_SETGID | 1 << CAP_SETUID | 1 << CAP_SYS_PTRACE;
const PROBE_UID: u32 = 65534;

/// The calling thread's own credentials, measured once per data-plane thread.
pub struct Baseline {
    effective: u64,
    permitted: u64,
    inheritable: u64,
    fsuid: u32,
    fsgid: u32,
    groups: Vec<u32>,
    fsuid_drops_caps: bool,
    /// this process's /proc/self/fd, kept for reopens (None: the four-component path)
    fd_dir: Option<OwnedFd>,
    /// what the thread's fsgid and groups are now (a Baseline is its thread's own)
    now: RefCell<Lingering>,
}

/// The fsgid and supplementary groups a switch left on the thread (the module's doc).
struct Lingering {
    fsgid: u32,
    groups: Vec<u32>,
}

impl Lingering {
    /// Switch the thread to these, each only if it differs from what the thread has now
    /// (setting an id to the value it has changes nothing: the kernel allocates new
    /// credentials only to discard them); the groups are copied in place.
    fn switch_to(&mut self, fsgid: u32, groups: &[u32]) -> Result<(), sys::Errno> {
        if self.groups != groups {
            sys::setgroups_thread(groups)?;
            self.groups.clear();
            self.groups.extend_from_slice(groups);
        }
        if self.fsgid != fsgid {
            sys::setfsgid(fsgid);
            self.fsgid = fsgid;
        }
        Ok(())
    }
}

impl Baseline {
    pub fn measure() -> Result<Baseline, sys::Errno> {
        let (effective, permitted, inheritable) = sys::capget_thread()?;
        let (fsuid, fsgid) = sys::euid_egid();
        let mut buf = [0u32; 1024];
        let n = sys::getgroups(&mut buf)?;
        // room for the groups of most target threads: a switch copies them in place
        let mut now_groups = Vec::with_capacity(n.max(64));
        now_groups.extend_from_slice(&buf[..n]);
        let mut base = Baseline {
            effective,
            permitted,
            inheritable,
            fsuid,
            fsgid,
            groups: buf[..n].to_vec(),
            fsuid_drops_caps: false,
            fd_dir: sys::open_own_fd_dir().ok(),
            now: RefCell::new(Lingering {
                fsgid,
                groups: now_groups,
            }),
        };
        base.fsuid_drops_caps = base.probe_fsuid_drops_caps()?;
        Ok(base)
    }

    /// Back to the thread's own fsgid and groups (before Python code runs on the thread,
    /// and after a panic); Err if the groups could not be restored.
    pub fn settle(&self) -> Result<(), sys::Errno> {
        self.now.borrow_mut().switch_to(self.fsgid, &self.groups)
    }

    /// The calling thread's credentials are still the ones measured (checked after a
    /// panic was caught mid-call and the thread settled, before it serves on).
    pub fn still_holds(&self) -> bool {
        let Ok((effective, permitted, inheritable)) = sys::capget_thread() else {
            return false;
        };
        let mut buf = [0u32; 1024];
        let Ok(n) = sys::getgroups(&mut buf) else {
            return false;
        };
        (effective, permitted, inheritable) == (self.effective, self.permitted, self.inheritable)
            // an invalid id (-1) changes nothing and returns the current fs id
            && sys::setfsuid(u32::MAX) == self.fsuid
            && sys::setfsgid(u32::MAX) == self.fsgid
            && buf[..n] == self.groups[..]
    }

    /// open("/proc/self/fd/N", flags) of one of our fds: a new open file with an open's
    /// permission checks, through the kept /proc/self/fd (one path component, not four).
    pub fn reopen(&self, obj: BorrowedFd<'_>, flags: i32) -> Result<OwnedFd, sys::Errno> {
        match &self.fd_dir {
            Some(dir) => sys::reopen_in(dir.as_fd(), obj, flags),
            None => sys::reopen(obj, flags),
        }
    }

    /// Whether leaving fsuid 0 alone drops every capability an open could consult
    /// (credentials._Baseline._fsuid_drops_caps), measured on this thread.
    fn probe_fsuid_drops_caps(&self) -> Result<bool, sys::Errno> {
        if self.fsuid != 0 || self.effective != self.permitted {
            return Ok(false);
        }
        sys::setfsuid(PROBE_UID);
        let during = sys::capget_thread();
        sys::setfsuid(0);
        let after = sys::capget_thread()?.0;
        Ok(during?.0 & !OPEN_NEUTRAL_CAPS == 0 && after == self.effective)
    }
}

/// In force from new() to drop: the thread acts as `creds` for a reopen of an object
/// fhmon holds (no path walk of the target's).
pub struct ActingAs<'a> {
    base: &'a Baseline,
    creds: &'a Credentials,
    fsuid_only: bool,
}

impl<'a> ActingAs<'a> {
    /// For a path walk of the target's (acting_as(creds)): the whole switch.
    pub fn full(base: &'a Baseline, creds: &'a Credentials) -> Result<Self, sys::Errno> {
        Self::switch(base, creds, false)
    }

    pub fn reopen_only(base: &'a Baseline, creds: &'a Credentials) -> Result<Self, sys::Errno> {
        let fsuid_only = base.fsuid_drops_caps && creds.cap_effective == 0 && creds.fsuid != 0;
        Self::switch(base, creds, fsuid_only)
    }

    fn switch(
        base: &'a Baseline,
        creds: &'a Credentials,
        fsuid_only: bool,
    ) -> Result<Self, sys::Errno> {
        let guard = ActingAs {
            base,
            creds,
            fsuid_only,
        };
        // on an error the guard's drop switches back whatever was switched
        base.now
            .borrow_mut()
            .switch_to(creds.fsgid, &creds.groups)?;
        // an fsuid equal to fhmon's own is not switched either (Lingering::switch_to)
        if creds.fsuid != base.fsuid {
            sys::setfsuid(creds.fsuid);
        }
        if !fsuid_only {
            sys::capset_thread(
                creds.cap_effective & base.permitted,
                base.permitted,
                base.inheritable,
            )?;
        }
        Ok(guard)
    }
}

impl Drop for ActingAs<'_> {
    fn drop(&mut self) {
        let base = self.base;
        if !self.fsuid_only {
            let _ = sys::capset_thread(base.permitted, base.permitted, base.inheritable);
        }
        if self.creds.fsuid != base.fsuid {
            sys::setfsuid(base.fsuid); // back to 0: the kernel raises the fs caps again
        }
        // fsgid and groups linger (the module's doc)
        if !self.fsuid_only && base.effective != base.permitted {
            let _ = sys::capset_thread(base.effective, base.permitted, base.inheritable);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fresh_baseline_still_holds_and_a_changed_fsgid_does_not() {
        let base = Baseline::measure().expect("measure");
        assert!(base.still_holds());
        let before = sys::setfsgid(base.fsgid.wrapping_add(1));
        let changed = base.still_holds();
        sys::setfsgid(before);
        if sys::euid_egid().0 == 0 {
            assert!(
                !changed,
                "a thread whose fsgid moved must not count as unchanged"
            );
        }
        assert!(base.still_holds());
    }

    /// fsuid and capabilities come back with the guard; fsgid and groups linger until the
    /// next switch that needs others, or settle() (runs as root, as CI does; skipped else).
    #[test]
    fn fsgid_and_groups_linger_and_settle_restores_them() {
        if sys::euid_egid().0 != 0 {
            return;
        }
        // a thread of its own: the test harness's threads must not keep what this sets
        std::thread::spawn(|| {
            let base = Baseline::measure().expect("measure");
            let creds = Credentials {
                fsuid: 65534,
                fsgid: 65533,
                groups: vec![65532],
                cap_effective: 0,
            };
            {
                let _acting = ActingAs::reopen_only(&base, &creds).expect("switch");
                assert_eq!(sys::setfsuid(u32::MAX), 65534);
                assert_eq!(sys::setfsgid(u32::MAX), 65533);
            }
            assert_eq!(sys::setfsuid(u32::MAX), base.fsuid, "fsuid switched back");
            assert_eq!(sys::capget_thread().expect("capget").0, base.effective);
            assert_eq!(sys::setfsgid(u32::MAX), 65533, "fsgid lingers");
            let mut buf = [0u32; 64];
            let n = sys::getgroups(&mut buf).expect("getgroups");
            assert_eq!(&buf[..n], &[65532], "groups linger");
            assert!(!base.still_holds());
            // the same creds again: nothing to switch but fsuid, and the same outcome
            drop(ActingAs::reopen_only(&base, &creds).expect("switch"));
            assert_eq!(sys::setfsgid(u32::MAX), 65533);
            base.settle().expect("settle");
            assert!(
                base.still_holds(),
                "settle() brings the thread back to its own"
            );
        })
        .join()
        .expect("the test thread");
    }
}
