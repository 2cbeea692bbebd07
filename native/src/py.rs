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
            .ok_or_else(|| PyValueError::new_err("kernel handle too large for the MAC trailer"))?;
        Ok(PyBytes::new(py, &out[..n]))
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

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<PyKeyRing>()?;
    Ok(())
}
