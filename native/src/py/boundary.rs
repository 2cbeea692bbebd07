//! The typed values that cross the plane's boundary, each with named fields: in, the
//! settings `Plane` is made with (`PlaneConfig`) and the share `Plane.add` takes
//! (`ShareRoot`); out, the counts `Plane.take_stats` hands back (`PlaneStats`) and the
//! refusals `Plane.drain_events` does (`RefusalEvent`).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::{os_error, share_id};
use crate::mac;

/// A pinned share as Plane.add takes it: the facts monitor/policy.py pin_share decided and
/// the share root's two fds, borrowed: Plane.add duplicates them, the Python side keeps
/// owning (and closes) its own.
#[pyclass(name = "ShareRoot", module = "monitor._native", frozen)]
pub struct PyShareRoot {
    share_id: mac::ShareId,
    /// O_RDONLY|O_DIRECTORY: the mount_fd of open_by_handle_at
    dir_fd: i32,
    /// O_PATH: for identity and path checks
    path_fd: i32,
    facts: crate::policy::ShareFacts,
}

impl PyShareRoot {
    /// The plane's own copy: the same facts, fds of its own.
    pub(super) fn duplicate(&self) -> PyResult<crate::plane::Share> {
        Ok(crate::plane::Share {
            share_id: self.share_id,
            dir_fd: crate::sys::dup(self.dir_fd).map_err(os_error)?,
            path_fd: crate::sys::dup(self.path_fd).map_err(os_error)?,
            facts: self.facts,
            memo: if self.facts.whole_fs {
                crate::inside_memo::InsideMemo::disabled()
            } else {
                crate::inside_memo::InsideMemo::watching()
            },
        })
    }
}

#[pymethods]
impl PyShareRoot {
    #[new]
    #[pyo3(signature = (*, share_id, dir_fd, path_fd, mount_id, dev, ino, whole_fs))]
    fn new(
        share_id: &[u8],
        dir_fd: i32,
        path_fd: i32,
        mount_id: u64,
        dev: u64,
        ino: u64,
        whole_fs: bool,
    ) -> PyResult<Self> {
        Ok(PyShareRoot {
            share_id: self::share_id(share_id)?,
            dir_fd,
            path_fd,
            facts: crate::policy::ShareFacts {
                mount_id,
                dev,
                ino,
                whole_fs,
            },
        })
    }

    #[getter]
    fn share_id<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.share_id)
    }

    #[getter]
    fn dir_fd(&self) -> i32 {
        self.dir_fd
    }

    #[getter]
    fn path_fd(&self) -> i32 {
        self.path_fd
    }

    #[getter]
    fn mount_id(&self) -> u64 {
        self.facts.mount_id
    }

    #[getter]
    fn dev(&self) -> u64 {
        self.facts.dev
    }

    #[getter]
    fn ino(&self) -> u64 {
        self.facts.ino
    }

    #[getter]
    fn whole_fs(&self) -> bool {
        self.facts.whole_fs
    }
}

/// What Plane.take_stats hands over: the counts since its last call, per syscall in the
/// order of crate::plane::SYSCALLS (only the syscalls that had a call), for
/// monitor/dataplane.py to merge into CallStats, Target.calls and the log.
#[pyclass(name = "PlaneStats", module = "monitor._native", frozen, get_all)]
pub struct PyPlaneStats {
    /// (syscall, result: its errno, 0 for ok, -1 for a caller gone before the answer, calls)
    pub(super) results: Vec<(String, i32, u64)>,
    /// (syscall, seconds its calls took)
    pub(super) seconds: Vec<(String, f64)>,
    /// (syscall, its calls in each latency bucket: crate::plane::BUCKETS of them)
    pub(super) buckets: Vec<(String, Vec<u64>)>,
    /// (refusal reason, calls refused for it)
    pub(super) refusals: Vec<(String, u64)>,
    /// (target id, calls answered natively)
    pub(super) calls: Vec<(u64, u64)>,
    /// calls whose work panicked (each answered EIO, its thread serving on)
    pub(super) panics: u64,
}

/// The settings of a `Plane`, from fhmon's configuration (monitor/dataplane.py).
#[pyclass(name = "PlaneConfig", module = "monitor._native", frozen, get_all)]
pub struct PyPlaneConfig {
    /// the name_to_handle_at flags the plane accepts (the reference's ACCEPTED_FLAGS)
    pub(super) accepted_flags: i32,
    /// sign handles (fhmon's `signing` key)
    pub(super) signing: bool,
    /// native threads per target (data_plane_threads: a number, or 2 for "auto")
    pub(super) threads_per_target: usize,
    /// data_plane_threads = "auto": the second thread reads only with a second CPU
    pub(super) auto_threads: bool,
    /// the latency buckets' upper bounds, seconds (monitor/metrics.py LATENCY_BUCKETS)
    pub(super) buckets: [f64; crate::plane::BUCKETS],
    /// the most pidfds each target's thread cache holds
    pub(super) pidfds_per_target: usize,
}

#[pymethods]
impl PyPlaneConfig {
    #[new]
    #[pyo3(signature = (*, accepted_flags, signing, threads_per_target, auto_threads, buckets,
                        pidfds_per_target = crate::plane::PIDFD_CACHE))]
    fn new(
        accepted_flags: i32,
        signing: bool,
        threads_per_target: usize,
        auto_threads: bool,
        buckets: Vec<f64>,
        pidfds_per_target: usize,
    ) -> PyResult<Self> {
        let buckets = buckets.try_into().map_err(|_| {
            PyValueError::new_err(format!(
                "{} latency buckets expected",
                crate::plane::BUCKETS
            ))
        })?;
        Ok(PyPlaneConfig {
            accepted_flags,
            signing,
            threads_per_target,
            auto_threads,
            buckets,
            pidfds_per_target,
        })
    }
}

impl PyPlaneConfig {
    /// The plane's own copy.
    pub(super) fn to_config(&self) -> crate::plane::Config {
        crate::plane::Config {
            accepted_flags: self.accepted_flags,
            signing: self.signing,
            threads_per_target: self.threads_per_target,
            auto_threads: self.auto_threads,
            buckets: self.buckets,
            pidfds_per_target: self.pidfds_per_target,
        }
    }
}

/// One refused call, as Plane.drain_events hands it to the audit log.
#[pyclass(name = "RefusalEvent", module = "monitor._native", frozen, get_all)]
pub struct PyRefusalEvent {
    /// "name_to_handle_at" or "open_by_handle_at"
    pub(super) syscall: &'static str,
    pub(super) errno: i32,
    /// the refusal's reason text (protocol/refusals.toml)
    pub(super) reason: &'static str,
    /// the calling thread, and its process when it could be read
    pub(super) tid: u32,
    pub(super) tgid: Option<u32>,
    pub(super) target_id: u64,
}
