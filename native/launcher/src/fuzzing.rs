//! The bodies of the launcher's property loop (tests/parsers.rs): each feeds arbitrary
//! bytes to one of its parsers and checks that it answers (never a panic) and keeps its
//! own promises. The intake codec's own is fhmon_native::fuzzing::intake.

use crate::{args, channel, stuck_calls, users};

/// Arbitrary bytes as an argv: NUL-separated.
fn argv_of(data: &[u8]) -> Vec<Vec<u8>> {
    data.split(|&b| b == 0).map(<[u8]>::to_vec).collect()
}

/// args::parse and served_argv: with no handle or migration flag asked, CMD is untouched;
/// otherwise argv[0] and everything from CMD's own "--" on stay as given, and an asked
/// handle mode is the one --inode-file-handles left, last before that "--" (where no flag
/// without "=" took that "--" for its value).
pub fn arguments(data: &[u8]) {
    let Ok(inv) = args::parse(&argv_of(data)) else {
        return;
    };
    let o = &inv.options;
    let served = args::served_argv(&inv.argv, o);
    if o.virtiofsd_handles.is_none() && !o.migration_by_handle {
        assert_eq!(served, inv.argv);
        return;
    }
    assert_eq!(served.first(), inv.argv.first());
    let tail = |argv: &[Vec<u8>]| -> Vec<Vec<u8>> {
        let at = argv
            .iter()
            .skip(1)
            .position(|a| a.as_slice() == b"--")
            .map_or(argv.len(), |p| p + 1);
        argv[at.min(argv.len())..].to_vec()
    };
    let kept = tail(&inv.argv);
    // A flag given without "=" takes the next argument as its value, whatever it is (a
    // "--" too, as the Python launcher did): only without such a flag is the tail certain.
    let bare = |a: &Vec<u8>| {
        a.as_slice() == b"--inode-file-handles" || a.as_slice() == b"--migration-mode"
    };
    if inv.argv.iter().skip(1).any(bare) {
        return;
    }
    assert!(served.ends_with(&kept));
    if let Some(mode) = o.virtiofsd_handles {
        let head = &served[..served.len() - kept.len()];
        let flag = |a: &Vec<u8>| {
            a.as_slice() == b"--inode-file-handles" || a.starts_with(b"--inode-file-handles=")
        };
        assert_eq!(head.iter().skip(1).filter(|a| flag(a)).count(), 1);
        assert_eq!(
            head.last().map(Vec::as_slice),
            Some(format!("--inode-file-handles={mode}").as_bytes())
        );
    }
}

/// users::parse_user over an arbitrary spec and tables (the first two NUL-separated
/// pieces are /etc/passwd and /etc/group): ids given as numbers come back as given.
pub fn user(data: &[u8]) {
    let mut parts = data.splitn(3, |&b| b == 0);
    let spec = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let passwd = String::from_utf8_lossy(parts.next().unwrap_or_default());
    let group = String::from_utf8_lossy(parts.next().unwrap_or_default());
    if let Ok((uid, gid)) = users::parse_user(&spec, &passwd, &group) {
        let (name, g) = spec.split_once(':').unwrap_or((&spec, ""));
        if let Ok(n) = name.parse::<u32>() {
            if name.bytes().all(|b| b.is_ascii_digit()) {
                assert_eq!(uid, n);
            }
        }
        if let Ok(n) = g.parse::<u32>() {
            if g.bytes().all(|b| b.is_ascii_digit()) {
                assert_eq!(gid, n);
            }
        }
    }
}

/// The child channel's parsers: frames re-encode to their bytes, and the outcomes of a
/// probe and a failed exec never panic.
pub fn channel_bytes(data: &[u8]) {
    if let Ok(Some(frame)) = channel::parse_frame(data) {
        assert_eq!(
            channel::frame(frame.kind, frame.payload),
            &data[..frame.used]
        );
        let argv = channel::split_argv(frame.payload);
        assert!(!argv.is_empty());
        assert_eq!(argv.join(&0u8), frame.payload);
    }
    let _ = channel::probe_outcome(data);
    if let Some((code, _)) = channel::exec_outcome(data) {
        assert!(code >= 0);
        assert_eq!(data[0], channel::EXEC_FAILED);
    }
    let _ = stuck_calls::thread_state(data);
}
