//! The refusal table as the native plane compiled it.

use pyo3::prelude::*;

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
pub(super) fn refusal_table() -> Vec<RefusalRow> {
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
