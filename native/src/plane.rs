//! The native data plane: per target, a few threads blocked in RECV answer its calls.
//!
//! Isolation by construction: a target's calls are answered only by its own threads
//! (`threads_per_target`), so a call that blocks or crawls holds that target's threads and
//! nobody else's. Under data_plane_threads = "auto" (the default) those are two, of which
//! only one works on a call at a time and the second reads only while it may use another
//! CPU (Spare). The per-call counters are lock-free. A panic in a call's work is caught:
//! the call is answered EIO (the reference's answer when a handler raises), counted, and
//! the thread keeps serving. No thread holds the GIL while it receives or answers; a call
//! the native code does not handle yet is passed to the Python reference (`Fallback`),
//! serialised per target, before anything has reached the target: answers stay identical.
//!
//! Ported errno for errno: monitor/handlers/name_to_handle_at.py and open_by_handle_at.py,
//! and Answerer's uid check. What still goes to the fallback: another uid's call (the
//! reference answers EPERM and audits it), other syscalls or architectures (ENOSYS), and
//! the rare cases noted where they arise (a kernel without PIDFD_THREAD).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::abi::{self, Notification};
use crate::creds::{ActingAs, Baseline};
use crate::handle::{self, MAX_HANDLE_SZ, MAX_KERNEL_HANDLE_SIZE};
use crate::mac::KeyRing;
use crate::policy::{self, PATH_MAX};
use crate::status::Status;
use crate::sys::{self, Errno};

mod caller;
mod hangups;
mod n2h;
mod obh;
mod outcome;
mod spare;
mod stats;
mod target;
mod target_thread;
mod thread_cache;

use hangups::{listener_hung_up, watch_hangups};
use stats::{Audit, Counters};
use target_thread::{open_proc_link, read_path, take_fd, write};

use outcome::{Outcome, err, resource_or_gone};
use spare::{Spare, lock, take_work};
use target::Target;
use thread_cache::remember;

pub use stats::{BUCKETS, GONE, MAX_ERRNO, Refused, SYSCALLS, Stats};
pub use target::Share;
pub use thread_cache::PIDFD_CACHE;

/// errnos whose refusal with a reason is audited (monitor/plane/audit.py _POLICY_ERRNOS)
const POLICY_ERRNOS: [i32; 5] = [
    libc::EACCES,
    libc::ESTALE,
    libc::EOPNOTSUPP,
    libc::ENOSYS,
    libc::ELOOP,
];

/// A call the Python reference answers instead (target id, the raw notification).
pub type Fallback = dyn Fn(u64, &[u8; abi::SECCOMP_NOTIF_SIZE]) + Send + Sync;
/// Told (once) that a target's filter has no task left.
pub type HangUp = dyn Fn(u64) + Send + Sync;

pub struct Config {
    pub accepted_flags: i32,
    pub signing: bool,
    pub threads_per_target: usize,
    /// data_plane_threads = "auto": every thread but the first reads only while it may run
    /// on two CPUs or more (Spare), else it parks
    pub auto_threads: bool,
    /// latency bucket upper bounds, seconds (monitor/metrics.py LATENCY_BUCKETS)
    pub buckets: [f64; BUCKETS],
    /// each target's thread cache holds at most this many pidfds (its fair share of
    /// RLIMIT_NOFILE: monitor/plane/thread_cache.py cached_threads_per_target);
    /// 1..=PIDFD_CACHE
    pub pidfds_per_target: usize,
}

struct Running {
    target: Arc<Target>,
    threads: Vec<JoinHandle<()>>,
}

pub struct Plane {
    config: Config,
    keys: RwLock<Option<Arc<KeyRing>>>,
    targets: Mutex<Vec<Running>>,
    counters: Counters,
    audit: Audit,
    /// native call counts of targets removed since the last take_stats
    removed_calls: Mutex<Vec<(u64, u64)>>,
    /// test hook (monitor._native.Plane.panic_next_calls): this many coming calls panic in their work
    panic_next: AtomicU64,
    stopped: AtomicBool,
    fallback: Box<Fallback>,
    hang_up: Box<HangUp>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    /// fhmon's own root: (st_dev, st_ino, unique mount id)
    our_root: Option<(u64, u64, u64)>,
}

impl Plane {
    pub fn new(config: Config, fallback: Box<Fallback>, hang_up: Box<HangUp>) -> Arc<Plane> {
        let _ = sys::install_wake_handler();
        let counters = Counters::new(config.buckets);
        let plane = Arc::new(Plane {
            config,
            keys: RwLock::new(None),
            targets: Mutex::new(Vec::new()),
            counters,
            audit: Audit::new(),
            removed_calls: Mutex::new(Vec::new()),
            panic_next: AtomicU64::new(0),
            stopped: AtomicBool::new(false),
            fallback,
            hang_up,
            watcher: Mutex::new(None),
            our_root: sys::open_path(c"/").ok().and_then(|fd| {
                let (dev, ino) = sys::fstat_dev_ino(fd.as_fd()).ok()?;
                let (_, mnt) = sys::statx_mode_mount(fd.as_fd()).ok()?;
                Some((dev, ino, mnt))
            }),
        });
        let weak = Arc::downgrade(&plane);
        let watcher = std::thread::Builder::new()
            .name("fhmon-hangups".into())
            .spawn(move || watch_hangups(weak));
        if let Ok(handle) = watcher {
            *lock(&plane.watcher) = Some(handle);
        }
        plane
    }

    pub fn set_keys(&self, ring: Arc<KeyRing>) {
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = Some(ring);
    }

    fn keys(&self) -> Option<Arc<KeyRing>> {
        self.keys.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Serve a target's listener (the plane owns the fds passed in).
    pub fn add(
        self: &Arc<Self>,
        id: u64,
        listener: OwnedFd,
        share: Share,
        peer_uid: u32,
    ) -> Result<(), Errno> {
        let target = Arc::new(Target::new(
            id,
            listener,
            share,
            peer_uid,
            self.config.pidfds_per_target,
        ));
        let mut threads = Vec::new();
        for k in 0..self.config.threads_per_target.max(1) {
            let plane = Arc::clone(self);
            let t = Arc::clone(&target);
            let spawned = std::thread::Builder::new()
                .name(format!("fhmon-t{id}-{k}"))
                .spawn(move || plane.serve(&t, k));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    stop_threads(&target, threads);
                    return Err(e.raw_os_error().unwrap_or(libc::EAGAIN));
                }
            }
        }
        lock(&self.targets).push(Running { target, threads });
        Ok(())
    }

    /// Stop serving a target; returns once none of its threads is answering a call, with
    /// the plane's copies of its fds closed.
    pub fn remove(&self, id: u64) {
        let running = {
            let mut targets = lock(&self.targets);
            let Some(i) = targets.iter().position(|r| r.target.id == id) else {
                return;
            };
            targets.swap_remove(i)
        };
        stop_threads(&running.target, running.threads);
        let calls = running.target.calls.swap(0, Ordering::SeqCst);
        if calls > 0 {
            lock(&self.removed_calls).push((id, calls));
        }
    }

    pub fn stop(&self) {
        self.stopped.store(true, Ordering::SeqCst);
        let all: Vec<Running> = std::mem::take(&mut *lock(&self.targets));
        for running in all {
            stop_threads(&running.target, running.threads);
        }
        self.audit.wake_all();
        if let Some(watcher) = lock(&self.watcher).take() {
            let _ = watcher.join();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Wait until refusals are queued, the plane stops, or the timeout passes.
    pub fn wait(&self, timeout: Duration) {
        self.audit.wait(timeout, || self.is_stopped());
    }

    /// The counts made since the last take, zeroed.
    pub fn take_stats(&self) -> Stats {
        let mut stats = self.counters.take();
        stats.refusals = self.audit.take_refusals();
        stats.calls = std::mem::take(&mut *lock(&self.removed_calls));
        for running in lock(&self.targets).iter() {
            let n = running.target.calls.swap(0, Ordering::SeqCst);
            if n > 0 {
                stats.calls.push((running.target.id, n));
            }
        }
        stats
    }

    /// Test hook: the next `n` calls answered natively panic inside their work (each must
    /// be answered EIO and counted, and its thread keep serving).
    pub fn panic_next_calls(&self, n: u64) {
        self.panic_next.store(n, Ordering::SeqCst);
    }

    pub fn drain_events(&self) -> (Vec<Refused>, u64) {
        self.audit.drain()
    }

    fn serve(&self, target: &Target, k: usize) {
        sys::block_signals_but_wake();
        let base = Baseline::measure().ok();
        let mut raw = [0u8; abi::SECCOMP_NOTIF_SIZE];
        let mut spare = (k > 0 && self.config.auto_threads).then(Spare::new);
        while !target.stopping.load(Ordering::SeqCst) {
            if spare.as_mut().is_some_and(Spare::confined) {
                let parked = lock(&target.spare_lock);
                if !target.stopping.load(Ordering::SeqCst) {
                    let _ = target.spare_wake.wait_timeout(parked, Spare::RECHECK);
                }
                continue;
            }
            match sys::notif_recv(target.listener.as_fd(), &mut raw) {
                Ok(()) => {}
                Err(libc::EINTR) => continue,
                Err(libc::ENOENT) if !listener_hung_up(target) => continue, // caller gone
                Err(_) => {
                    // a listener RECV refuses for good (or, no task left, answers ENOENT
                    // at once, forever: seen on 6.18): wait to be stopped
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                }
            }
            let start = Instant::now();
            let working = self.config.auto_threads.then(|| take_work(&target.work));
            let answered = self.answer(target, &raw, base.as_ref(), start, working);
            if answered.is_err() {
                // a panic: serve on only with the credentials the thread started with
                if base
                    .as_ref()
                    .is_some_and(|b| b.settle().is_err() || !b.still_holds())
                {
                    eprintln!(
                        "fhmon: data-plane thread of target {} stops after a panic: its \
                         credentials changed",
                        target.id
                    );
                    return;
                }
            }
        }
    }

    /// One call: its work under catch_unwind (a panic answers it EIO, as the reference's
    /// registry does when a handler raises, and is counted); Err(()) after a panic.
    fn answer(
        &self,
        target: &Target,
        raw: &[u8; abi::SECCOMP_NOTIF_SIZE],
        base: Option<&Baseline>,
        start: Instant,
        mut working: Option<std::sync::MutexGuard<'_, ()>>,
    ) -> Result<(), ()> {
        let notif = Notification::parse(raw);
        let syscall = match (notif.arch, notif.nr) {
            (abi::AUDIT_ARCH_X86_64, abi::SYS_NAME_TO_HANDLE_AT) => Some(0),
            (abi::AUDIT_ARCH_X86_64, abi::SYS_OPEN_BY_HANDLE_AT) if base.is_some() => Some(1),
            _ => None,
        };
        let work = || {
            if self.panic_next.load(Ordering::Relaxed) > 0
                && self
                    .panic_next
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok()
            {
                panic!("injected by the test hook Plane.panic_next_calls");
            }
            self.outcome(target, &notif, syscall, base)
        };
        let (outcome, panicked) = match guarded(work) {
            Some(outcome) => (outcome, false),
            None => {
                self.counters.panicked();
                (err(libc::EIO), true)
            }
        };
        let syscall = syscall.unwrap_or(0);
        if !matches!(outcome, Outcome::Defer) {
            // the work is done: the answer is the target's to wait for, not the plane's
            // CPU, and holding the lock over it made the other thread, woken by the
            // target's next call, wait for this one (n2h p50 9.6 against 6.3 us)
            working.take();
        }
        let result = match outcome {
            Outcome::Defer => {
                // Python code runs on this thread next: with the thread's own fsgid and
                // groups (creds.rs Lingering), never a target's
                if base.is_some_and(|b| b.settle().is_err()) {
                    let resp = abi::encode_response(notif.id, 0, libc::EIO);
                    let _ = sys::notif_send(target.listener.as_fd(), &resp);
                    self.counters
                        .record(target, syscall, libc::EIO as usize, start);
                    return Ok(());
                }
                let _serial = lock(&target.fallback_lock);
                (self.fallback)(target.id, raw);
                return Ok(()); // the Python reference counts its own calls
            }
            Outcome::Gone => GONE,
            Outcome::Inject(fd, newfd_flags) => self.inject(target, &notif, fd, newfd_flags),
            Outcome::Return(val) => {
                let resp = abi::encode_response(notif.id, val, 0);
                let _ = sys::notif_send(target.listener.as_fd(), &resp);
                0
            }
            Outcome::Error(errno, reason) => {
                if let Some(reason) = reason.filter(|_| POLICY_ERRNOS.contains(&errno)) {
                    if !matches!(
                        sys::notif_id_valid(target.listener.as_fd(), notif.id),
                        Ok(true)
                    ) {
                        self.counters.record(target, syscall, GONE, start);
                        return Ok(());
                    }
                    self.audit
                        .refused(target, syscall, errno, reason, notif.pid);
                }
                let resp = abi::encode_response(notif.id, 0, errno);
                let _ = sys::notif_send(target.listener.as_fd(), &resp);
                (errno as usize).min(MAX_ERRNO)
            }
        };
        self.counters.record(target, syscall, result, start);
        if panicked { Err(()) } else { Ok(()) }
    }

    /// ADDFD|SEND: the fd lands in the target and the call returns its number, atomically.
    fn inject(&self, target: &Target, n: &Notification, fd: OwnedFd, newfd_flags: u32) -> usize {
        let addfd = abi::encode_addfd(
            n.id,
            std::os::fd::AsRawFd::as_raw_fd(&fd),
            newfd_flags,
            abi::SECCOMP_ADDFD_FLAG_SEND,
        );
        // no signal may interrupt ADDFD|SEND once the kernel marked the call answered
        let mask = sys::block_all_signals();
        let added = sys::notif_addfd(target.listener.as_fd(), &addfd);
        sys::restore_signals(&mask);
        drop(fd);
        match added {
            Ok(_) => 0,
            Err(libc::ENOENT) => GONE,
            Err(e) => {
                // e.g. EMFILE in the target: the call still waits for an answer
                let resp = abi::encode_response(n.id, 0, e);
                let _ = sys::notif_send(target.listener.as_fd(), &resp);
                (e as usize).min(MAX_ERRNO)
            }
        }
    }

    /// What to answer: the uid check, then the handler (None: not one of ours).
    fn outcome(
        &self,
        target: &Target,
        notif: &Notification,
        syscall: Option<usize>,
        base: Option<&Baseline>,
    ) -> Outcome {
        let mut status = None;
        match syscall {
            Some(which) => match self.owned_by_peer(target, notif, &mut status) {
                Ok(true) if which == 0 => self.name_to_handle_at(target, notif, base, &mut status),
                Ok(true) => match base {
                    Some(base) => self.open_by_handle_at(target, notif, base, &mut status),
                    None => Outcome::Defer,
                },
                Ok(false) => Outcome::Defer, // the reference refuses it (EPERM + audit)
                Err(outcome) => outcome,
            },
            None => Outcome::Defer,
        }
    }
}

/// Run a call's work, catching a panic (None): the thread survives to answer the call and
/// the next ones. Locks a panic leaves poisoned are taken over by lock(); the credentials
/// guard (creds::ActingAs) switches back as it unwinds.
fn guarded<T>(work: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(work)).ok()
}

/// Tell a target's threads to stop and wait for each (re-sending the wake signal: one
/// sent just before a thread entered RECV would be lost).
fn stop_threads(target: &Target, threads: Vec<JoinHandle<()>>) {
    use std::os::unix::thread::JoinHandleExt;
    target.stopping.store(true, Ordering::SeqCst);
    {
        let _parked = lock(&target.spare_lock);
        target.spare_wake.notify_all();
    }
    for handle in threads {
        while !handle.is_finished() {
            sys::wake_thread(handle.as_pthread_t());
            std::thread::sleep(Duration::from_micros(200));
        }
        let _ = handle.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_in_the_work_is_caught_and_the_next_call_runs() {
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let first = guarded(|| -> i32 { panic!("a handler bug") });
        let second = guarded(|| 7);
        std::panic::set_hook(quiet);
        assert!(first.is_none());
        assert_eq!(second, Some(7));
    }
}
