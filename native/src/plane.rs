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
//!
//! This file keeps the plane's lifecycle (new, add, remove, stop) and each thread's serve
//! loop. One call then reads down the folder, never back up: plane/answer.rs (Answerer:
//! the work under catch_unwind, the one place that answers) -> plane/call.rs (Call, the
//! call's context) -> the uid check (plane/caller.rs) and the handler (plane/n2h.rs,
//! plane/obh.rs) -> what they use: plane/target_thread.rs (the caller's memory, fds and
//! /proc links), plane/thread_cache.rs, plane/outcome.rs (Outcome and its errno rules).
//! Beside them: plane/target.rs (one target's state), plane/stats.rs (counters, audit
//! events), plane/spare.rs (Spare, the work lock), plane/hangups.rs (the hang-up watcher).

use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::abi;
use crate::creds::Baseline;
use crate::mac::KeyRing;
use crate::sys::{self, Errno};

mod answer;
mod call;
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

use answer::Answerer;
use hangups::{listener_hung_up, watch_hangups};
use spare::{Spare, lock, take_work};
use target::Target;

pub use answer::Fallback;
pub use stats::{BUCKETS, GONE, MAX_ERRNO, Refused, SYSCALLS, Stats};
pub use target::Share;
pub use thread_cache::PIDFD_CACHE;

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

/// The native plane: its targets and their threads, the answerer they share, and the
/// hang-up watcher.
pub struct Plane {
    config: Config,
    answerer: Answerer,
    targets: Mutex<Vec<Running>>,
    /// native call counts of targets removed since the last take_stats
    removed_calls: Mutex<Vec<(u64, u64)>>,
    stopped: AtomicBool,
    hang_up: Box<HangUp>,
    watcher: Mutex<Option<JoinHandle<()>>>,
}

impl Plane {
    pub fn new(config: Config, fallback: Box<Fallback>, hang_up: Box<HangUp>) -> Arc<Plane> {
        let _ = sys::install_wake_handler();
        let answerer = Answerer::new(
            config.accepted_flags,
            config.signing,
            config.buckets,
            fallback,
        );
        let plane = Arc::new(Plane {
            config,
            answerer,
            targets: Mutex::new(Vec::new()),
            removed_calls: Mutex::new(Vec::new()),
            stopped: AtomicBool::new(false),
            hang_up,
            watcher: Mutex::new(None),
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
        self.answerer.settings.set_keys(ring);
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
        // each thread says when it has set itself up (its Baseline, whose kept
        // /proc/self/fd is an fd of ours): add returns with the target's every fd open,
        // so that what fhmon holds for a target does not still grow once it serves
        let (ready, set_up) = std::sync::mpsc::channel::<()>();
        for k in 0..self.config.threads_per_target.max(1) {
            let plane = Arc::clone(self);
            let t = Arc::clone(&target);
            let ready = ready.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("fhmon-t{id}-{k}"))
                .spawn(move || plane.serve(&t, k, ready));
            match spawned {
                Ok(handle) => threads.push(handle),
                Err(e) => {
                    stop_threads(&target, threads);
                    return Err(e.raw_os_error().unwrap_or(libc::EAGAIN));
                }
            }
        }
        drop(ready);
        // one message per thread; Err once every sender is gone (a thread that ended first)
        for _ in &threads {
            if set_up.recv().is_err() {
                break;
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
        self.answerer.audit.wake_all();
        if let Some(watcher) = lock(&self.watcher).take() {
            let _ = watcher.join();
        }
    }

    pub fn is_stopped(&self) -> bool {
        self.stopped.load(Ordering::SeqCst)
    }

    /// Wait until refusals are queued, the plane stops, or the timeout passes.
    pub fn wait(&self, timeout: Duration) {
        self.answerer.audit.wait(timeout, || self.is_stopped());
    }

    /// The counts made since the last take, zeroed.
    pub fn take_stats(&self) -> Stats {
        let mut stats = self.answerer.counters.take();
        stats.refusals = self.answerer.audit.take_refusals();
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
        self.answerer.panic_next_calls(n);
    }

    pub fn drain_events(&self) -> (Vec<Refused>, u64) {
        self.answerer.audit.drain()
    }

    fn serve(&self, target: &Target, k: usize, ready: std::sync::mpsc::Sender<()>) {
        sys::block_signals_but_wake();
        let base = Baseline::measure().ok();
        let _ = ready.send(());
        drop(ready);
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
                    // at once, forever: seen on 6.18): wait to be stopped, woken at once
                    // by stop_threads (a sleep would outlast its signal: std's sleep
                    // resumes after EINTR, and the remover waits, on the intake's thread)
                    let parked = lock(&target.spare_lock);
                    if !target.stopping.load(Ordering::SeqCst) {
                        let _ = target
                            .spare_wake
                            .wait_timeout(parked, Duration::from_millis(50));
                    }
                    continue;
                }
            }
            let start = Instant::now();
            let working = self.config.auto_threads.then(|| take_work(&target.work));
            let answered = self
                .answerer
                .answer(target, &raw, base.as_ref(), start, working);
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
