//! `Plane`: the native data plane as monitor/dataplane.py drives it.

use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::boundary::{PyPlaneConfig, PyPlaneStats, PyRefusalEvent, PyShareRoot};
use super::keyring::PyKeyRing;
use super::os_error;

/// The native data plane (native/src/plane.rs); monitor/dataplane wraps it.
#[pyclass(name = "Plane", module = "monitor._native", frozen)]
pub struct PyPlane {
    plane: std::sync::Arc<crate::plane::Plane>,
}

#[pymethods]
impl PyPlane {
    /// fallback(target_id, raw_notification) answers what the native code does not;
    /// hung_up(target_id) runs once a target's filter has no task left. Both are called
    /// from native threads, with the GIL taken for the call only.
    #[new]
    fn new(config: &Bound<'_, PyPlaneConfig>, fallback: Py<PyAny>, hung_up: Py<PyAny>) -> Self {
        let config = config.get().to_config();
        let fallback = Box::new(
            move |target_id: u64, raw: &[u8; crate::abi::SECCOMP_NOTIF_SIZE]| {
                Python::attach(|py| {
                    let raw = PyBytes::new(py, raw);
                    if let Err(e) = fallback.call1(py, (target_id, raw)) {
                        e.print(py);
                    }
                })
            },
        );
        let hung_up = Box::new(move |target_id: u64| {
            Python::attach(|py| {
                if let Err(e) = hung_up.call1(py, (target_id,)) {
                    e.print(py);
                }
            })
        });
        PyPlane {
            plane: crate::plane::Plane::new(config, fallback, hung_up),
        }
    }

    fn set_keys(&self, ring: &PyKeyRing) {
        self.plane.set_keys(std::sync::Arc::clone(&ring.ring));
    }

    /// Serve a listener; every fd is duplicated (the plane closes its copies on remove).
    /// The share's facts come from monitor/policy.py pin_share (whole_fs included), never
    /// recomputed here, so both planes decide "inside" from the same registration.
    fn add(
        &self,
        py: Python<'_>,
        target_id: u64,
        listener_fd: i32,
        peer_uid: u32,
        share: &Bound<'_, PyShareRoot>,
    ) -> PyResult<()> {
        let share = share.get().duplicate()?;
        let listener = crate::sys::dup(listener_fd).map_err(os_error)?;
        let plane = std::sync::Arc::clone(&self.plane);
        py.detach(move || plane.add(target_id, listener, share, peer_uid))
            .map_err(os_error)
    }

    /// Stop serving a target: returns once no native thread answers its calls.
    fn remove(&self, py: Python<'_>, target_id: u64) {
        let plane = std::sync::Arc::clone(&self.plane);
        py.detach(move || plane.remove(target_id));
    }

    fn stop(&self, py: Python<'_>) {
        let plane = std::sync::Arc::clone(&self.plane);
        py.detach(move || plane.stop());
    }

    #[getter]
    fn stopped(&self) -> bool {
        self.plane.is_stopped()
    }

    /// Sleep (without the GIL) until refusals are queued, the plane stops, or timeout.
    fn wait(&self, py: Python<'_>, timeout: f64) {
        let plane = std::sync::Arc::clone(&self.plane);
        let timeout = std::time::Duration::from_secs_f64(timeout.clamp(0.0, 3600.0));
        py.detach(move || plane.wait(timeout));
    }

    /// What the plane counted since the last call (each count handed over once).
    fn take_stats(&self) -> PyPlaneStats {
        let stats = self.plane.take_stats();
        let mut results = Vec::new();
        let mut seconds = Vec::new();
        let mut buckets = Vec::new();
        for (i, name) in crate::plane::SYSCALLS.iter().enumerate() {
            let mut any = false;
            for (result, &n) in stats.results[i].iter().enumerate() {
                if n > 0 {
                    any = true;
                    let code = if result == crate::plane::GONE {
                        -1
                    } else {
                        result as i32
                    };
                    results.push((name.to_string(), code, n));
                }
            }
            if any {
                seconds.push((name.to_string(), stats.seconds[i]));
                buckets.push((name.to_string(), stats.buckets[i].to_vec()));
            }
        }
        let refusals = stats
            .refusals
            .iter()
            .map(|(r, n)| (r.to_string(), *n))
            .collect();
        PyPlaneStats {
            results,
            seconds,
            buckets,
            refusals,
            calls: stats.calls,
            panics: stats.panics,
        }
    }

    /// Test hook: the next `n` natively answered calls panic inside their work; each must
    /// be answered EIO and counted, and its thread must keep serving. Only in a build with
    /// the feature test-hooks.
    #[cfg(feature = "test-hooks")]
    fn panic_next_calls(&self, n: u64) {
        self.plane.panic_next_calls(n);
    }

    /// The refusals queued since the last call, and how many were dropped (the queue is
    /// bounded).
    fn drain_events(&self) -> (Vec<PyRefusalEvent>, u64) {
        let (events, dropped) = self.plane.drain_events();
        let out = events
            .into_iter()
            .map(|e| PyRefusalEvent {
                syscall: crate::plane::SYSCALLS[e.syscall],
                errno: e.errno,
                reason: e.reason,
                tid: e.tid,
                tgid: e.tgid,
                target_id: e.target_id,
            })
            .collect();
        (out, dropped)
    }
}
