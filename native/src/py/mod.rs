//! The Python face of the crate: `monitor._native`, one class or concern a file.

mod boundary;
mod intake;
mod keyring;
mod plane;
mod refusals;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::handle::SHARE_ID_SIZE;
use crate::mac;

fn share_id(raw: &[u8]) -> PyResult<mac::ShareId> {
    raw.try_into()
        .map_err(|_| PyValueError::new_err(format!("share id must be {SHARE_ID_SIZE} bytes")))
}

fn os_error(errno: i32) -> PyErr {
    pyo3::exceptions::PyOSError::new_err((
        errno,
        std::io::Error::from_raw_os_error(errno).to_string(),
    ))
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("VERSION", env!("CARGO_PKG_VERSION"))?;
    // whether KeyRing.cost and Plane.panic_next_calls are there (tests fail, naming the fix,
    // without them)
    m.add("TEST_HOOKS", cfg!(feature = "test-hooks"))?;
    m.add_class::<keyring::PyKeyRing>()?;
    m.add_class::<boundary::PyPlaneConfig>()?;
    m.add_class::<boundary::PyShareRoot>()?;
    m.add_class::<boundary::PyPlaneStats>()?;
    m.add_class::<boundary::PyRefusalEvent>()?;
    m.add_class::<plane::PyPlane>()?;
    m.add_function(wrap_pyfunction!(intake::intake_encode, m)?)?;
    m.add_function(wrap_pyfunction!(intake::intake_decode, m)?)?;
    m.add_function(wrap_pyfunction!(refusals::refusal_table, m)?)?;
    Ok(())
}
