//! The two typed values that cross the plane's boundary: the share `Plane.add` takes and
//! the counts `Plane.take_stats` hands back.

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
