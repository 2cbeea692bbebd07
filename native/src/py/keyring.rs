//! `KeyRing`: the signing keys in locked memory, as monitor.signing.KeyRing signs.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

use super::share_id;
use crate::handle::MAX_HANDLE_SZ;
use crate::mac;

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
