//! The Python face of the crate: `monitor._native`.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use crate::handle::{MAX_HANDLE_SZ, SHARE_ID_SIZE};
use crate::mac;

fn share_id(raw: &[u8]) -> PyResult<mac::ShareId> {
    raw.try_into()
        .map_err(|_| PyValueError::new_err(format!("share id must be {SHARE_ID_SIZE} bytes")))
}

/// A key ring in locked memory: the same handles as monitor.signing.KeyRing.
#[pyclass(name = "KeyRing", module = "monitor._native", frozen)]
pub struct PyKeyRing {
    pub(crate) ring: std::sync::Arc<mac::KeyRing>,
}

#[pymethods]
impl PyKeyRing {
    #[new]
    fn new(keys: &Bound<'_, PyDict>, signer: u32) -> PyResult<Self> {
        let mut owned: Vec<(u32, Vec<u8>)> = Vec::with_capacity(keys.len());
        for (k, v) in keys.iter() {
            owned.push((k.extract()?, v.extract()?));
        }
        let ring = mac::KeyRing::new(owned.iter().map(|(id, b)| (*id, &b[..])), signer)
            .map_err(|e| PyValueError::new_err(e.to_string()));
        for (_, bytes) in owned.iter_mut() {
            zeroize::Zeroize::zeroize(bytes); // the copies made for the ring
        }
        Ok(PyKeyRing {
            ring: std::sync::Arc::new(ring?),
        })
    }

    #[getter]
    fn signer(&self) -> u32 {
        self.ring.signer_id()
    }

    #[getter]
    fn key_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.ring.key_ids().collect();
        ids.sort_unstable();
        ids
    }

    /// The f_handle to give a target (kernel bytes + key id + MAC).
    fn sign<'py>(
        &self,
        py: Python<'py>,
        share: &[u8],
        handle_type: i32,
        kernel_bytes: &[u8],
    ) -> PyResult<Bound<'py, PyBytes>> {
        let mut out = [0u8; MAX_HANDLE_SZ];
        let n = self
            .ring
            .sign(&share_id(share)?, handle_type, kernel_bytes, &mut out)
            .ok_or_else(|| PyValueError::new_err(crate::refusals::HANDLE_TOO_LARGE.text()))?;
        Ok(PyBytes::new(py, &out[..n]))
    }

    /// What signing and verifying cost inside the data plane (no Python call per
    /// operation): microseconds per sign and per verify of an 8-byte kernel handle, each the
    /// mean of `iterations` runs (bench/levers.py reports it against the 1 us bound for signing in the native plane).
    /// A test hook: only in a build with the feature test-hooks.
    #[cfg(feature = "test-hooks")]
    fn cost(&self, py: Python<'_>, iterations: u32) -> PyResult<(f64, f64)> {
        if iterations == 0 {
            return Err(PyValueError::new_err("iterations must be at least 1"));
        }
        let share: mac::ShareId = [7u8; 32];
        let kernel = [5u8; 8];
        py.detach(|| {
            let mut out = [0u8; MAX_HANDLE_SZ];
            let start = std::time::Instant::now();
            for _ in 0..iterations {
                std::hint::black_box(self.ring.sign(
                    std::hint::black_box(&share),
                    1,
                    &kernel,
                    &mut out,
                ));
            }
            let sign = start.elapsed().as_secs_f64();
            let n = self.ring.sign(&share, 1, &kernel, &mut out).unwrap_or(0);
            if self.ring.verify(&share, 1, &out[..n]) != Some(&kernel[..]) {
                return Err(PyValueError::new_err(
                    "a handle this ring signed did not verify",
                ));
            }
            let start = std::time::Instant::now();
            for _ in 0..iterations {
                std::hint::black_box(self.ring.verify(std::hint::black_box(&share), 1, &out[..n]));
            }
            let verify = start.elapsed().as_secs_f64();
            let per_op = |total: f64| total * 1e6 / f64::from(iterations);
            Ok((per_op(sign), per_op(verify)))
        })
    }

    /// The kernel bytes if the MAC is right for this share and a known key, else None.
    fn verify<'py>(
        &self,
        py: Python<'py>,
        share: &[u8],
        handle_type: i32,
        f_handle: &[u8],
    ) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let share = share_id(share)?;
        Ok(self
            .ring
            .verify(&share, handle_type, f_handle)
            .map(|k| PyBytes::new(py, k)))
    }
}

fn os_error(errno: i32) -> PyErr {
    pyo3::exceptions::PyOSError::new_err((
        errno,
        std::io::Error::from_raw_os_error(errno).to_string(),
    ))
}

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
    /// pidfds_per_target: the most pidfds each target's thread cache holds.
    #[new]
    #[pyo3(signature = (accepted_flags, signing, threads_per_target, auto_threads, buckets,
                        fallback, hung_up, pidfds_per_target = crate::plane::PIDFD_CACHE))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        accepted_flags: i32,
        signing: bool,
        threads_per_target: usize,
        auto_threads: bool,
        buckets: Vec<f64>,
        fallback: Py<PyAny>,
        hung_up: Py<PyAny>,
        pidfds_per_target: usize,
    ) -> PyResult<Self> {
        let buckets: [f64; crate::plane::BUCKETS] = buckets.try_into().map_err(|_| {
            PyValueError::new_err(format!(
                "{} latency buckets expected",
                crate::plane::BUCKETS
            ))
        })?;
        let config = crate::plane::Config {
            accepted_flags,
            signing,
            threads_per_target,
            auto_threads,
            buckets,
            pidfds_per_target,
        };
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
        Ok(PyPlane {
            plane: crate::plane::Plane::new(config, fallback, hung_up),
        })
    }

    fn set_keys(&self, ring: &PyKeyRing) {
        self.plane.set_keys(std::sync::Arc::clone(&ring.ring));
    }

    /// Serve a listener; every fd is duplicated (the plane closes its copies on remove).
    /// The share's facts come from monitor/policy.py pin_share (whole_fs included), never
    /// recomputed here, so both planes decide "inside" from the same registration.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &self,
        py: Python<'_>,
        target_id: u64,
        listener_fd: i32,
        peer_uid: u32,
        share_id: &[u8],
        dir_fd: i32,
        path_fd: i32,
        mount_id: u64,
        dev: u64,
        ino: u64,
        whole_fs: bool,
    ) -> PyResult<()> {
        let share = crate::plane::Share {
            share_id: self::share_id(share_id)?,
            dir_fd: crate::sys::dup(dir_fd).map_err(os_error)?,
            path_fd: crate::sys::dup(path_fd).map_err(os_error)?,
            facts: crate::policy::ShareFacts {
                mount_id,
                dev,
                ino,
                whole_fs,
            },
        };
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

    /// Counts since the last call: {(syscall, result errno or 0 ok, -1 gone): n},
    /// {syscall: seconds}, {syscall: bucket counts}, {reason: n}, {target id: calls
    /// answered natively}, panics caught (each of those calls answered EIO).
    #[allow(clippy::type_complexity)]
    fn take_stats(
        &self,
    ) -> (
        Vec<(String, i32, u64)>,
        Vec<(String, f64)>,
        Vec<(String, Vec<u64>)>,
        Vec<(String, u64)>,
        Vec<(u64, u64)>,
        u64,
    ) {
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
        (
            results,
            seconds,
            buckets,
            refusals,
            stats.calls,
            stats.panics,
        )
    }

    /// Test hook: the next `n` natively answered calls panic inside their work; each must
    /// be answered EIO and counted, and its thread must keep serving. Only in a build with
    /// the feature test-hooks.
    #[cfg(feature = "test-hooks")]
    fn panic_next_calls(&self, n: u64) {
        self.plane.panic_next_calls(n);
    }

    /// Queued refusals: [(syscall, errno, reason, tid, tgid or None, target_id)], dropped.
    #[allow(clippy::type_complexity)]
    fn drain_events(&self) -> (Vec<(String, i32, String, u32, Option<u32>, u64)>, u64) {
        let (events, dropped) = self.plane.drain_events();
        let out = events
            .into_iter()
            .map(|e| {
                (
                    crate::plane::SYSCALLS[e.syscall].to_string(),
                    e.errno,
                    e.reason.to_string(),
                    e.tid,
                    e.tgid,
                    e.target_id,
                )
            })
            .collect();
        (out, dropped)
    }
}

fn field<'py, T: FromPyObjectOwned<'py>>(fields: &Bound<'py, PyDict>, name: &str) -> PyResult<T> {
    match fields.get_item(name)? {
        Some(value) => value.extract().map_err(Into::into),
        None => Err(PyValueError::new_err(format!("missing field {name}"))),
    }
}

/// The intake message `kind` (protocol/intake_wire.py's class name) with `fields` (its
/// dataclass fields), encoded by the launcher's codec (crate::intake): for the test that
/// holds it to protocol/intake_wire.py byte for byte.
#[pyfunction]
fn intake_encode<'py>(
    py: Python<'py>,
    kind: &str,
    fields: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyBytes>> {
    use crate::intake::Message;
    let id = |v: Vec<u8>| -> PyResult<[u8; 32]> {
        v.try_into()
            .map_err(|_| PyValueError::new_err("share_id must be 32 bytes"))
    };
    let message = match kind {
        "Hello" => Message::Hello {
            target_pid: field(fields, "target_pid")?,
            share: field(fields, "share")?,
            client: field(fields, "client")?,
            flags: field(fields, "flags")?,
            version: field(fields, "version")?,
            share_id: field::<Option<Vec<u8>>>(fields, "share_id")?
                .map(id)
                .transpose()?,
        },
        "Accept" => Message::Accept {
            target_id: field(fields, "target_id")?,
            share_id: id(field(fields, "share_id")?)?,
            message: field(fields, "message")?,
        },
        "Refuse" => Message::Refuse {
            errno: field(fields, "errno")?,
            reason: field(fields, "reason")?,
        },
        "Ping" => Message::Ping,
        "Pong" => Message::Pong {
            json: field(fields, "json")?,
        },
        "StatusRequest" => Message::StatusRequest {
            after: field(fields, "after")?,
        },
        "StatusReply" => Message::StatusReply {
            json: field(fields, "json")?,
        },
        other => {
            return Err(PyValueError::new_err(format!(
                "not a message kind: {other}"
            )));
        }
    };
    let bytes = crate::intake::encode(&message).map_err(|e| PyValueError::new_err(e.0))?;
    Ok(PyBytes::new(py, &bytes))
}

/// One whole intake frame decoded by the launcher's codec: (class name, fields);
/// ValueError with the protocol error's text for bad bytes.
#[pyfunction]
fn intake_decode<'py>(
    py: Python<'py>,
    data: &[u8],
) -> PyResult<(&'static str, Bound<'py, PyDict>)> {
    use crate::intake::Message;
    let message = crate::intake::decode_one(data).map_err(|e| PyValueError::new_err(e.0))?;
    let out = PyDict::new(py);
    match &message {
        Message::Hello {
            target_pid,
            share,
            client,
            flags,
            version,
            share_id,
        } => {
            out.set_item("target_pid", target_pid)?;
            out.set_item("share", share)?;
            out.set_item("client", client)?;
            out.set_item("flags", flags)?;
            out.set_item("version", version)?;
            out.set_item("share_id", share_id.map(|i| PyBytes::new(py, &i)))?;
        }
        Message::Accept {
            target_id,
            share_id,
            message,
        } => {
            out.set_item("target_id", target_id)?;
            out.set_item("share_id", PyBytes::new(py, share_id))?;
            out.set_item("message", message)?;
        }
        Message::Refuse { errno, reason } => {
            out.set_item("errno", errno)?;
            out.set_item("reason", reason)?;
        }
        Message::Ping => {}
        Message::Pong { json } | Message::StatusReply { json } => out.set_item("json", json)?,
        Message::StatusRequest { after } => out.set_item("after", after)?,
    }
    Ok((message.name(), out))
}

/// A refusal of the table as the native plane compiled it (native/build.rs): code, errno,
/// errno name, reason, its parts, counted, and the finished {strerror} texts by errno with
/// the fallback's. tests/unit/test_refusals.py compares them with protocol/refusals.py's.
type RefusalRow = (
    &'static str,
    i32,
    &'static str,
    &'static str,
    Vec<&'static str>,
    bool,
    Vec<(i32, &'static str)>,
    &'static str,
);

/// Every refusal the native plane knows, in the table's order.
#[pyfunction]
fn refusal_table() -> Vec<RefusalRow> {
    crate::refusals::ALL
        .iter()
        .map(|e| {
            (
                e.code,
                e.errno,
                e.errno_name,
                e.reason,
                e.parts.to_vec(),
                e.counted,
                e.strerror.to_vec(),
                e.strerror_otherwise,
            )
        })
        .collect()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    // whether KeyRing.cost and Plane.panic_next_calls are there (tests fail, naming the fix,
    // without them)
    m.add("TEST_HOOKS", cfg!(feature = "test-hooks"))?;
    m.add_class::<PyKeyRing>()?;
    m.add_class::<PyPlane>()?;
    m.add_function(wrap_pyfunction!(intake_encode, m)?)?;
    m.add_function(wrap_pyfunction!(intake_decode, m)?)?;
    m.add_function(wrap_pyfunction!(refusal_table, m)?)?;
    Ok(())
}
