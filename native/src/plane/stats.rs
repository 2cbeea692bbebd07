//! What the plane counts and tells Python: per syscall, each call's result and latency
//! (`Counters`, lock-free), and the refusals for the audit log (`Audit`: counted by reason
//! and queued as events); `Stats` is what take_stats hands over. The reference counts the
//! same in monitor/metrics.py CallStats and writes the refusals in monitor/plane/audit.py.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::spare::lock;
use super::target::Target;
use super::target_thread::read_tgid;

/// The syscalls the plane answers; a syscall's index here is its index in Stats.
pub const SYSCALLS: [&str; 2] = ["name_to_handle_at", "open_by_handle_at"];
/// errno values 1..=MAX_ERRNO get a counter each; index 0 counts "ok", GONE "gone".
pub const MAX_ERRNO: usize = 133;
pub const GONE: usize = MAX_ERRNO + 1;
const RESULTS: usize = MAX_ERRNO + 2;
pub const BUCKETS: usize = 16;
const MAX_EVENTS: usize = 4096;

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
pub(super) struct Counters {
    results: [[AtomicU64; RESULTS]; 2],
    nanos: [AtomicU64; 2],
    buckets: [[AtomicU64; BUCKETS + 1]; 2],
    panics: AtomicU64,
    /// latency bucket upper bounds, seconds (Config::buckets)
    bounds: [f64; BUCKETS],
}

impl Counters {
    pub(super) fn new(bounds: [f64; BUCKETS]) -> Counters {
        Counters {
            results: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            nanos: std::array::from_fn(|_| AtomicU64::new(0)),
            buckets: std::array::from_fn(|_| std::array::from_fn(|_| AtomicU64::new(0))),
            panics: AtomicU64::new(0),
            bounds,
        }
    }

    /// One call answered (or gone): its result (0, an errno, GONE) and its time since
    /// `start`, also counted as one of the target's native calls.
    pub(super) fn record(&self, target: &Target, syscall: usize, result: usize, start: Instant) {
        let elapsed = start.elapsed();
        let seconds = elapsed.as_secs_f64();
        let bucket = self
            .bounds
            .iter()
            .position(|&b| seconds <= b)
            .unwrap_or(BUCKETS);
        self.results[syscall][result].fetch_add(1, Ordering::Relaxed);
        let nanos = u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX);
        self.nanos[syscall].fetch_add(nanos, Ordering::Relaxed);
        self.buckets[syscall][bucket].fetch_add(1, Ordering::Relaxed);
        target.calls.fetch_add(1, Ordering::Relaxed);
    }

    /// A panic caught in a call's work.
    pub(super) fn panicked(&self) {
        self.panics.fetch_add(1, Ordering::Relaxed);
    }

    /// The counts made since the last take, zeroed (refusals and calls left empty).
    pub(super) fn take(&self) -> Stats {
        let mut stats = Stats::default();
        for s in 0..2 {
            for (out, n) in stats.results[s].iter_mut().zip(&self.results[s]) {
                *out = n.swap(0, Ordering::Relaxed);
            }
            for (out, n) in stats.buckets[s].iter_mut().zip(&self.buckets[s]) {
                *out = n.swap(0, Ordering::Relaxed);
            }
            stats.seconds[s] = self.nanos[s].swap(0, Ordering::Relaxed) as f64 * 1e-9;
        }
        stats.panics = self.panics.swap(0, Ordering::Relaxed);
        stats
    }
}

struct Events {
    queue: VecDeque<Refused>,
    dropped: u64,
}

/// The refusals for the audit log: a count per reason, and the refusals themselves queued
/// for Python to drain (at most MAX_EVENTS: the oldest are dropped, and counted).
pub(super) struct Audit {
    refusals: Mutex<Vec<(&'static str, u64)>>,
    events: Mutex<Events>,
    wakeup: Condvar,
}

impl Audit {
    pub(super) fn new() -> Audit {
        Audit {
            refusals: Mutex::new(Vec::new()),
            events: Mutex::new(Events {
                queue: VecDeque::with_capacity(64),
                dropped: 0,
            }),
            wakeup: Condvar::new(),
        }
    }

    /// Count a refusal with its reason and queue it (the TID's thread group read now, as
    /// the reference's audit line has it), waking whoever waits for events.
    pub(super) fn refused(
        &self,
        target: &Target,
        syscall: usize,
        errno: i32,
        reason: &'static str,
        tid: u32,
    ) {
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

    /// The refusal counts by reason since the last take.
    pub(super) fn take_refusals(&self) -> Vec<(&'static str, u64)> {
        std::mem::take(&mut *lock(&self.refusals))
    }

    /// The queued refusals, and how many were dropped since the last drain.
    pub(super) fn drain(&self) -> (Vec<Refused>, u64) {
        let mut events = lock(&self.events);
        let dropped = std::mem::take(&mut events.dropped);
        (events.queue.drain(..).collect(), dropped)
    }

    /// Wait until refusals are queued, `stopped` says so, or the timeout passes.
    pub(super) fn wait(&self, timeout: Duration, stopped: impl Fn() -> bool) {
        let events = lock(&self.events);
        if events.queue.is_empty() && !stopped() {
            let _ = self.wakeup.wait_timeout(events, timeout);
        }
    }

    /// Wake every waiter (the plane stops).
    pub(super) fn wake_all(&self) {
        self.wakeup.notify_all();
    }
}
