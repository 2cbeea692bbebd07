//! Every call refusal fhmon gives a reason for, compiled from protocol/refusals.toml (the
//! one table both data planes read; native/build.rs turns it into these constants). The
//! Python plane takes the same file (protocol/refusals.py): no reason, code or errno of a
//! refusal is written anywhere else.

/// One refusal: what the call returns, why (the audit line's text), and the fixed code the
/// metrics and the audit line name it by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub code: &'static str,
    pub errno: i32,
    /// as the table spells it (EOPNOTSUPP)
    pub errno_name: &'static str,
    /// the text, with `{name}` for each of its variable parts (`parts`)
    pub reason: &'static str,
    pub parts: &'static [&'static str],
    /// false: audited without a code and not counted (the Python plane gives those)
    pub counted: bool,
    /// for a `{strerror}` part: the finished reason of each errno the table names
    pub strerror: &'static [(i32, &'static str)],
    /// ... and of any other errno
    pub strerror_otherwise: &'static str,
}

impl Entry {
    /// The reason of a refusal without variable parts; for one with a `{strerror}` part,
    /// `with_strerror`. (Refusals with other parts are the Python plane's: the native one
    /// leaves those calls to it.)
    pub const fn text(&self) -> &'static str {
        assert!(self.parts.is_empty(), "this reason has variable parts");
        self.reason
    }

    /// The finished reason for the errno that stopped the check: its own text if the table
    /// names it, else the table's fallback (no reason carries an unforeseen errno).
    pub fn with_strerror(&self, errno: i32) -> &'static str {
        debug_assert!(self.parts == ["strerror"], "no {{strerror}} part");
        self.strerror
            .iter()
            .find(|(e, _)| *e == errno)
            .map_or(self.strerror_otherwise, |(_, text)| text)
    }
}

include!(concat!(env!("OUT_DIR"), "/refusals.rs"));

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_is_whole() {
        assert!(ALL.len() >= 12);
        for (i, entry) in ALL.iter().enumerate() {
            assert!(ALL[i + 1..].iter().all(|other| other.code != entry.code));
            // a reason is told by its constant beginning: none may hide a later one's
            let prefix = entry.reason.split('{').next().unwrap();
            for later in &ALL[i + 1..] {
                assert!(
                    !later.reason.starts_with(prefix),
                    "{} hides {}",
                    entry.code,
                    later.code
                );
            }
            assert_eq!(entry.parts.is_empty(), !entry.reason.contains('{'));
        }
        assert_eq!(MAC_INVALID.text(), "bad or foreign MAC");
        assert_eq!(MAC_INVALID.errno, libc::ESTALE);
        assert_eq!(PLACE_UNVERIFIABLE.errno_name, "EOPNOTSUPP");
    }

    #[test]
    fn strerror_variants_are_finished_texts() {
        assert_eq!(
            PLACE_UNVERIFIABLE.with_strerror(libc::ENAMETOOLONG),
            "file's place cannot be checked (File name too long)"
        );
        assert_eq!(
            PLACE_UNVERIFIABLE.with_strerror(libc::ELOOP),
            "file's place cannot be checked (Input/output error)"
        );
        assert_eq!(PLACE_UNVERIFIABLE.strerror.len(), 6);
    }
}
