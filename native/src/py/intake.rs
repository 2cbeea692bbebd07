//! The launcher's intake codec, for the test that holds it to protocol/intake_wire.py.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

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
pub(super) fn intake_encode<'py>(
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
pub(super) fn intake_decode<'py>(
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
