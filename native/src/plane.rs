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

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::abi::{self, Notification};
use crate::creds::{ActingAs, Baseline};
use crate::handle::{self, MAX_HANDLE_SZ, MAX_KERNEL_HANDLE_SIZE};
use crate::mac::{KeyRing, ShareId};
use crate::policy::{self, PATH_MAX, ShareFacts, ShareRoot};
use crate::status::Status;
use crate::sys::{self, Errno};

mod caller;
mod n2h;
mod obh;

pub const SYSCALLS: [&str; 2] = ["name_to_handle_at", "open_by_handle_at"];
/// errno values 1..=MAX_ERRNO get a counter each; index 0 counts "ok", GONE "gone".
pub const MAX_ERRNO: usize = 133;
pub const GONE: usize = MAX_ERRNO + 1;
const RESULTS: usize = MAX_ERRNO + 2;
pub const BUCKETS: usize = 16;
const MAX_EVENTS: usize = 4096;
/// The most pidfds a target's thread cache holds (Config::pidfds_per_target is at most this).
pub const PIDFD_CACHE: usize = 1024;
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

pub struct Share {
    /// signing.share_id_from_handle of the root, computed by Python at registration
    pub share_id: ShareId,
    pub dir_fd: OwnedFd,
    pub path_fd: OwnedFd,
    pub facts: ShareFacts,
}

impl Share {
    fn root(&self) -> ShareRoot<'_> {
        ShareRoot {
            facts: &self.facts,
            path_fd: self.path_fd.as_fd(),
            dir_fd: self.dir_fd.as_fd(),
        }
    }
}

/// A refusal for the audit log, as monitor/plane/audit.py audit_middleware writes it.
#[derive(Clone, Debug)]
pub struct Refused {
    pub syscall: usize,
    pub errno: i32,
    pub reason: &'static str,
    pub tid: u32,
    pub tgid: Option<u32>,
    pub target_id: u64,
}

#[derive(Clone)]
pub struct Stats {
    pub results: [[u64; RESULTS]; 2],
    pub seconds: [f64; 2],
    pub buckets: [[u64; BUCKETS + 1]; 2],
    pub refusals: Vec<(&'static str, u64)>,
    /// calls answered natively, per target id (the reference counts its own in Target.calls)
    pub calls: Vec<(u64, u64)>,
    /// panics caught in a call's work (each call answered EIO)
    pub panics: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            results: [[0; RESULTS]; 2],
            seconds: [0.0; 2],
            buckets: [[0; BUCKETS + 1]; 2],
            refusals: Vec::new(),
            calls: Vec::new(),
            panics: 0,
        }
    }
}

/// The per-call counters, lock-free: every target's threads count into them, and none
/// should wait for another (a preempted thread holding a lock would stall the others).
struct Counters {
    results: [[AtomicU64; RESULTS]; 2],
    nanos: [AtomicU64; 2],
    buckets: [[AtomicU64; BUCKETS + 1]; 2],
    panics: AtomicU64,
}

impl Counters {
    fn new() -> Counters {
        Counters {
            results: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            panics: AtomicU64::new(0),
        }
    }
}

struct Target {
    id: u64,
    listener: OwnedFd,
    share: Share,
    peer_uid: u32,
    stopping: AtomicBool,
    hung_up: AtomicBool,
    threads: Mutex<ThreadCache>,
    /// the target's last mount_fd on the share's filesystem (obh.rs known_mount_fd)
    mount_fd: Mutex<Option<obh::MountFdMemo>>,
    fallback_lock: Mutex<()>,
    /// calls answered natively since the last take_stats
    calls: AtomicU64,
    /// where a spare thread parks while it is confined to one CPU (Spare)
    spare_lock: Mutex<()>,
    spare_wake: Condvar,
    /// under "auto", held while a thread works on a call (Spare): one CPU per target
    work: Mutex<()>,
}

/// A target's second reader under data_plane_threads = "auto". With one reader, that
/// reader waits in ADDFD|SEND until the target has run and taken the fd, so the target's
/// next open_by_handle_at finds nobody in RECV; on an idle machine the two then drift to
/// different CPUs and each call wakes a halted CPU (p50 7x the reference's, unpinned:
/// docs/performance.md). A second reader blocked in RECV is woken where the target runs
/// (SYNC_WAKE_UP) instead. Confined to one CPU, it cannot run while the first waits and
/// only adds a switch per call (about 1 us, pinned), so it parks there: its affinity is
/// looked at once a second. It is there to read, not to work alongside: under "auto" a
/// thread works on a call only while it holds the target's `work` lock, given up for the
/// wait in ADDFD|SEND, so a target's calls use at most one CPU of the plane at a time (a
/// target crawling through symlinks on two threads had put its neighbour's p99 at 11x).
struct Spare {
    checked: Instant,
    confined: bool,
}

impl Spare {
    const RECHECK: Duration = Duration::from_secs(1);

    fn new() -> Spare {
        Spare {
            checked: Instant::now(),
            confined: sys::cpus_allowed() < 2,
        }
    }

    fn confined(&mut self) -> bool {
        if self.checked.elapsed() >= Self::RECHECK {
            self.checked = Instant::now();
            self.confined = sys::cpus_allowed() < 2;
        }
        self.confined
    }
}

/// A thread of the target seen before: its pidfd (which names that thread for as long as
/// it lives: a live pidfd's TID is the notifying thread's) and its real uid once its
/// credentials are known to be frozen (monitor/plane/thread_cache.py ThreadCache).
struct ThreadEntry {
    pidfd: OwnedFd,
    frozen: Option<Arc<Status>>,
}

/// A target's threads by TID: O(1) lookups, at most `limit` entries (a pidfd each), its
/// table allocated once when the target is added (an insert below the reserved capacity
/// never allocates; a full cache takes no new entry).
struct ThreadCache {
    entries: HashMap<u32, ThreadEntry>,
    limit: usize,
}

impl ThreadCache {
    fn new(limit: usize) -> ThreadCache {
        let limit = limit.clamp(1, PIDFD_CACHE);
        ThreadCache {
            entries: HashMap::with_capacity(limit),
            limit,
        }
    }

    fn get(&self, tid: u32) -> Option<&ThreadEntry> {
        self.entries.get(&tid)
    }

    fn get_mut(&mut self, tid: u32) -> Option<&mut ThreadEntry> {
        self.entries.get_mut(&tid)
    }

    fn forget(&mut self, tid: u32) {
        self.entries.remove(&tid);
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    /// The once-a-second sweep: keep the entries whose thread lives.
    fn retain(&mut self, mut keep: impl FnMut(&ThreadEntry) -> bool) {
        self.entries.retain(|_, e| keep(e));
    }
}

struct Running {
    target: Arc<Target>,
    threads: Vec<JoinHandle<()>>,
}

struct Events {
    queue: VecDeque<Refused>,
    dropped: u64,
}

pub struct Plane {
    config: Config,
    keys: RwLock<Option<Arc<KeyRing>>>,
    targets: Mutex<Vec<Running>>,
    counters: Counters,
    refusals: Mutex<Vec<(&'static str, u64)>>,
    /// native call counts of targets removed since the last take_stats
    removed_calls: Mutex<Vec<(u64, u64)>>,
    /// test hook (monitor._native.Plane.panic_next_calls): this many coming calls panic in their work
    #[cfg(feature = "test-hooks")]
    panic_next: AtomicU64,
    events: Mutex<Events>,
    wakeup: Condvar,
    stopped: AtomicBool,
    fallback: Box<Fallback>,
    hang_up: Box<HangUp>,
    watcher: Mutex<Option<JoinHandle<()>>>,
    /// fhmon's own root: (st_dev, st_ino, unique mount id)
    our_root: Option<(u64, u64, u64)>,
}

enum Outcome {
    Return(i64),
    /// answered by ADDFD|SEND of this fd with these newfd flags (the answer() sends it)
    Inject(OwnedFd, u32),
    Error(i32, Option<&'static str>),
    Gone,
    Defer,
}

fn err(errno: i32) -> Outcome {
    Outcome::Error(errno, None)
}

impl Plane {
    pub fn new(config: Config, fallback: Box<Fallback>, hang_up: Box<HangUp>) -> Arc<Plane> {
        let _ = sys::install_wake_handler();
        let plane = Arc::new(Plane {
            config,
            keys: RwLock::new(None),
            targets: Mutex::new(Vec::new()),
            counters: Counters::new(),
            refusals: Mutex::new(Vec::new()),
            removed_calls: Mutex::new(Vec::new()),
            #[cfg(feature = "test-hooks")]
            panic_next: AtomicU64::new(0),
            events: Mutex::new(Events {
                queue: VecDeque::with_capacity(64),
                dropped: 0,
            }),
            wakeup: Condvar::new(),
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
        let target = Arc::new(Target {
            id,
            listener,
            share,
            peer_uid,
            stopping: AtomicBool::new(false),
            hung_up: AtomicBool::new(false),
            threads: Mutex::new(ThreadCache::new(self.config.pidfds_per_target)),
            mount_fd: Mutex::new(None),
            fallback_lock: Mutex::new(()),
            calls: AtomicU64::new(0),
            spare_lock: Mutex::new(()),
            spare_wake: Condvar::new(),
            work: Mutex::new(()),
        });
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
        self.wakeup.notify_all();
        if let Some(watcher) = lock(&self.watcher).take() {
            let _ = watcher.join();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Wait until refusals are queued, the plane stops, or the timeout passes.
    pub fn wait(&self, timeout: Duration) {
        let events = lock(&self.events);
        if events.queue.is_empty() && !self.is_stopped() {
            let _ = self.wakeup.wait_timeout(events, timeout);
        }
    }

    /// The counts made since the last take, zeroed.
    pub fn take_stats(&self) -> Stats {
        let c = &self.counters;
        let mut stats = Stats::default();
        for s in 0..2 {
            for (out, n) in stats.results[s].iter_mut().zip(&c.results[s]) {
                *out = n.swap(0, Ordering::Relaxed);
            }
            for (out, n) in stats.buckets[s].iter_mut().zip(&c.buckets[s]) {
                *out = n.swap(0, Ordering::Relaxed);
            }
            stats.seconds[s] = c.nanos[s].swap(0, Ordering::Relaxed) as f64 * 1e-9;
        }
        stats.panics = c.panics.swap(0, Ordering::Relaxed);
        stats.refusals = std::mem::take(&mut *lock(&self.refusals));
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
    #[cfg(feature = "test-hooks")]
    pub fn panic_next_calls(&self, n: u64) {
        self.panic_next.store(n, Ordering::SeqCst);
    }

    pub fn drain_events(&self) -> (Vec<Refused>, u64) {
        let mut events = lock(&self.events);
        let dropped = std::mem::take(&mut events.dropped);
        (events.queue.drain(..).collect(), dropped)
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
            #[cfg(feature = "test-hooks")]
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
                self.counters.panics.fetch_add(1, Ordering::Relaxed);
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
                    self.record(target, syscall, libc::EIO as usize, start);
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
                        self.record(target, syscall, GONE, start);
                        return Ok(());
                    }
                    self.refused(target, syscall, errno, reason, notif.pid);
                }
                let resp = abi::encode_response(notif.id, 0, errno);
                let _ = sys::notif_send(target.listener.as_fd(), &resp);
                (errno as usize).min(MAX_ERRNO)
            }
        };
        self.record(target, syscall, result, start);
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

    fn record(&self, target: &Target, syscall: usize, result: usize, start: Instant) {
        let elapsed = start.elapsed();
        let seconds = elapsed.as_secs_f64();
        let bucket = self
            .config
            .buckets
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(BUCKETS);
        let c = &self.counters;
        c.results[syscall][result].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        c.nanos[syscall].fetch_add(nanos, Ordering::Relaxed);
        c.buckets[syscall][bucket].fetch_add(1, Ordering::Relaxed);
        target.calls.fetch_add(1, Ordering::Relaxed);
    }

    fn refused(&self, target: &Target, syscall: usize, errno: i32, reason: &'static str, tid: u32) {
        {
            let mut refusals = lock(&self.refusals);
            match refusals.iter_mut().find(|(r, _)| *r == reason) {
                Some((_, n)) => *n += 1,
                None => refusals.push((reason, 1)),
            }
        }
        let event = Refused {
            syscall,
            errno,
            reason,
            tid,
            tgid: read_tgid(tid),
            target_id: target.id,
        };
        let mut events = lock(&self.events);
        if events.queue.len() >= MAX_EVENTS {
            events.queue.pop_front();
            events.dropped += 1;
        }
        events.queue.push_back(event);
        self.wakeup.notify_all();
    }
}

impl Plane {
    /// TargetThread.take_fd(check=False): a duplicate of the target's fd through a cached
    /// pidfd of the calling thread (proved alive by the getfd itself) or a new one.
    fn take_fd(&self, target: &Target, n: &Notification, fd: i32) -> Result<OwnedFd, Outcome> {
        let mut cache = lock(&target.threads);
        if let Some(e) = cache.get(n.pid) {
            match sys::pidfd_getfd(e.pidfd.as_fd(), fd) {
                Ok(ours) => return Ok(ours),
                Err(err) if sys::pidfd_alive(e.pidfd.as_fd()) => {
                    return Err(getfd_error(target, n, err));
                }
                Err(_) => {
                    cache.forget(n.pid); // its thread died; the TID names a new one
                }
            }
        }
        let pidfd = match sys::pidfd_open(n.pid as i32, sys::PIDFD_THREAD) {
            Ok(p) => p,
            Err(libc::EINVAL) => return Err(Outcome::Defer), // a kernel before 6.9
            Err(e) => return Err(resource_or_gone(target, n, e)),
        };
        let ours = sys::pidfd_getfd(pidfd.as_fd(), fd).map_err(|e| getfd_error(target, n, e))?;
        remember(&mut cache, n.pid, pidfd, None);
        Ok(ours)
    }
}

/// Cache a thread's pidfd. A full cache takes no new entry (the pidfd is closed when it
/// drops): it never probes its entries on a put, which made every call of a target with
/// thousands of threads cost a pidfd_alive per cached thread (a neighbour's p50 went 12x,
/// bench/thread_cache.py; as the reference's ThreadCache.put); the once-a-second sweep makes room when threads exit.
fn remember(cache: &mut ThreadCache, tid: u32, pidfd: OwnedFd, frozen: Option<Arc<Status>>) {
    cache.forget(tid);
    if cache.len() < cache.limit {
        cache.entries.insert(tid, ThreadEntry { pidfd, frozen });
    }
}

/// Run a call's work, catching a panic (None): the thread survives to answer the call and
/// the next ones. Locks a panic leaves poisoned are taken over by lock(); the credentials
/// guard (creds::ActingAs) switches back as it unwinds.
fn guarded<T>(work: impl FnOnce() -> T) -> Option<T> {
    catch_unwind(AssertUnwindSafe(work)).ok()
}

/// getname(): a NUL-terminated path of at most PATH_MAX bytes with the NUL, read as
/// TargetThread.read_path (the first page first, where almost every path ends): its length
/// without the NUL (which buf holds at that index).
fn read_path(tid: i32, addr: u64, buf: &mut [u8; PATH_MAX]) -> Result<usize, Outcome> {
    const PAGE: u64 = crate::abi::PAGE_SIZE;
    if addr == 0 {
        return Err(err(libc::EFAULT));
    }
    let read = |at: u64, into: &mut [u8]| match sys::read_target(tid, at, into) {
        Ok(got) => Ok(got),
        Err(libc::ESRCH) => Err(Outcome::Gone),
        Err(_) => Err(err(libc::EIO)),
    };
    let first = (PATH_MAX as u64).min(PAGE - addr % PAGE) as usize;
    let got = read(addr, &mut buf[..first])?;
    if let Some(nul) = buf[..got].iter().position(|&b| b == 0) {
        return Ok(nul);
    }
    if got < first {
        return Err(err(libc::EFAULT));
    }
    let after = u128::from(addr) + first as u128;
    let rest = ((PATH_MAX - first) as u128).min((1u128 << 64) - after) as usize;
    let got = if rest == 0 {
        0
    } else {
        read(after as u64, &mut buf[first..first + rest])?
    };
    let total = first + got;
    match buf[..total].iter().position(|&b| b == 0) {
        Some(nul) => Ok(nul),
        None if total < PATH_MAX => Err(err(libc::EFAULT)),
        None => Err(err(libc::ENAMETOOLONG)),
    }
}

fn getfd_error(target: &Target, n: &Notification, e: Errno) -> Outcome {
    if !matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true)) {
        return Outcome::Gone;
    }
    if e == libc::EBADF || is_resource_errno(e) {
        err(e)
    } else {
        Outcome::Gone
    }
}

/// Out of fds or memory in fhmon (EMFILE, ENFILE, ENOMEM): the kernel's own answer in that
/// state, as the reference's RESOURCE_ERRNOS (monitor/plane/target_thread.py).
fn is_resource_errno(e: Errno) -> bool {
    matches!(e, libc::EMFILE | libc::ENFILE | libc::ENOMEM)
}

/// A failed pidfd_open, /proc open or /proc read: out of fds or memory is answered while
/// the call still waits (never "the caller went away", which answers nothing and leaves
/// the target waiting for good); any other failure means the caller is gone.
fn resource_or_gone(target: &Target, n: &Notification, e: Errno) -> Outcome {
    if is_resource_errno(e)
        && matches!(sys::notif_id_valid(target.listener.as_fd(), n.id), Ok(true))
    {
        err(e)
    } else {
        Outcome::Gone
    }
}

/// TargetThread.write: ID_VALID, then one process_vm_writev of the chunks that have a
/// plausible address; EFAULT unless every byte landed.
fn write(target: &Target, n: &Notification, chunks: &[(u64, &[u8])]) -> Result<(), Outcome> {
    match sys::notif_id_valid(target.listener.as_fd(), n.id) {
        Ok(true) => {}
        _ => return Err(Outcome::Gone),
    }
    let mut writable = 0;
    let mut expected = 0;
    for (addr, data) in chunks {
        if *addr == 0 || addr.checked_add(data.len() as u64).is_none() {
            break;
        }
        writable += 1;
        expected += data.len();
    }
    let written = if writable == 0 {
        Ok(0)
    } else {
        sys::write_target(n.pid as i32, &chunks[..writable])
    };
    match written {
        Ok(count) if count == expected && writable == chunks.len() => Ok(()),
        Ok(_) => Err(err(libc::EFAULT)),
        Err(libc::ESRCH) => Err(Outcome::Gone),
        Err(_) => Err(err(libc::EIO)),
    }
}

fn read_tgid(tid: u32) -> Option<u32> {
    let status = std::fs::read_to_string(format!("/proc/{tid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("Tgid:"))?;
    line["Tgid:".len()..].trim().parse().ok()
}

/// The target's work lock (Spare), spun for up to WORK_SPIN before sleeping for it: a
/// call of the target's other thread usually ends within that (3-7 us of work), and a
/// futex sleep and wake-up per call cost more CPU than the call itself (4 target threads,
/// unpinned: 22.8 us per call against 11.2 with one plane thread). A call that crawls
/// (a path walk of milliseconds, a lease break) is waited for asleep.
fn take_work(m: &Mutex<()>) -> std::sync::MutexGuard<'_, ()> {
    const WORK_SPIN: Duration = Duration::from_micros(20);
    let start = Instant::now();
    loop {
        for _ in 0..32 {
            match m.try_lock() {
                Ok(guard) => return guard,
                Err(std::sync::TryLockError::Poisoned(e)) => return e.into_inner(),
                Err(std::sync::TryLockError::WouldBlock) => std::hint::spin_loop(),
            }
        }
        if start.elapsed() >= WORK_SPIN {
            return lock(m);
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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

/// No task uses the target's filter any more (poll reports POLLHUP).
fn listener_hung_up(target: &Target) -> bool {
    let mut fds = [libc::pollfd {
        fd: std::os::fd::AsRawFd::as_raw_fd(&target.listener),
        events: 0,
        revents: 0,
    }];
    matches!(sys::poll_many(&mut fds, 0), Ok(n) if n > 0)
        && fds[0].revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// One thread for every target's hang-up: poll(events = 0) reports POLLHUP once no task
/// uses a filter; each is reported once, then left to remove(). It also sweeps the thread
/// caches.
fn watch_hangups(plane: std::sync::Weak<Plane>) {
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
                lock(&running.target.threads).retain(|e| sys::pidfd_alive(e.pidfd.as_fd()));
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
                fd: std::os::fd::AsRawFd::as_raw_fd(&t.listener),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn pidfd() -> OwnedFd {
        sys::pidfd_open(std::process::id() as i32, 0).expect("pidfd_open of ourselves")
    }

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
