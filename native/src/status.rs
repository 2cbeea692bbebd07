//! /proc/TID/status, parsed in safe code (the target controls its `Name:` line): the real
//! uid for the registering client's check, and whether the thread's credentials are frozen
//! (monitor/proc_status.py read_status: one uid and one gid everywhere, no capabilities,
//! no_new_privs), so that the uid may be cached for the thread's life.

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub tgid: u32,
    pub uid: u32,
    /// frozen but for CapEff: with no effective capability either, nothing the thread can
    /// do changes what permission checks see
    pub frozen: bool,
    /// frozen but for no_new_privs (and CapEff): only an execve (of a set-user-ID,
    /// set-group-ID or file-capability program) can change these credentials
    pub fixed_until_exec: bool,
    /// uids and gids as the file gives them (real, effective, saved, filesystem), for a
    /// comparison with what PIDFD_GET_INFO reports
    pub ids: [u32; 8],
    pub creds: Credentials,
}

/// What the kernel checks an open against (monitor/proc_status.py Credentials). cap_effective
/// is as the file says: the caller zeroes it for a thread in another user namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Credentials {
    pub fsuid: u32,
    pub fsgid: u32,
    pub groups: Vec<u32>,
    pub cap_effective: u64,
}

fn field<'a>(raw: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    raw.split(|&b| b == b'\n').find_map(|line| {
        let rest = line.strip_prefix(name)?.strip_prefix(b":")?;
        Some(rest.trim_ascii())
    })
}

fn numbers<const N: usize>(text: &[u8]) -> Option<[u32; N]> {
    let mut out = [0u32; N];
    let mut words = text
        .split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty());
    for slot in out.iter_mut() {
        *slot = std::str::from_utf8(words.next()?).ok()?.parse().ok()?;
    }
    Some(out)
}

fn hex(text: Option<&[u8]>) -> Option<u64> {
    text.and_then(|t| std::str::from_utf8(t).ok())
        .and_then(|t| u64::from_str_radix(t, 16).ok())
}

fn hex_is_zero(text: Option<&[u8]>) -> bool {
    hex(text) == Some(0)
}

fn groups(text: &[u8]) -> Option<Vec<u32>> {
    text.split(|b| b.is_ascii_whitespace())
        .filter(|w| !w.is_empty())
        .map(|w| std::str::from_utf8(w).ok()?.parse().ok())
        .collect()
}

/// None when a field the check needs is missing or malformed (the caller treats the call
/// as gone, as read_status does).
pub fn parse(raw: &[u8]) -> Option<Status> {
    let tgid = numbers::<1>(field(raw, b"Tgid")?)?[0];
    let uids = numbers::<4>(field(raw, b"Uid")?)?;
    let gids = numbers::<4>(field(raw, b"Gid")?)?;
    let same = |ids: &[u32; 4]| ids.iter().all(|&i| i == ids[0]);
    // CapEff is left to the caller: it counts only in fhmon's own user namespace
    let fixed_until_exec = same(&uids)
        && same(&gids)
        && hex_is_zero(field(raw, b"CapPrm"))
        && hex_is_zero(field(raw, b"CapAmb"));
    let frozen = fixed_until_exec && field(raw, b"NoNewPrivs") == Some(b"1");
    // PIDFD_GET_INFO's order: ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid
    let ids = [
        uids[0], gids[0], uids[1], gids[1], uids[2], gids[2], uids[3], gids[3],
    ];
    let creds = Credentials {
        fsuid: uids[3],
        fsgid: gids[3],
        groups: groups(field(raw, b"Groups")?)?,
        cap_effective: hex(field(raw, b"CapEff"))?,
    };
    Some(Status {
        tgid,
        uid: uids[0],
        frozen,
        fixed_until_exec,
        ids,
        creds,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOBODY: &[u8] = b"Name:\tUid: 0 0 0 0\nTgid:\t42\nUid:\t65534\t65534\t65534\t65534\n\
Gid:\t65534\t65534\t65534\t65534\nGroups:\t65534 7 \nCapEff:\t0000000000000000\nCapPrm:\t0000000000000000\n\
CapAmb:\t0000000000000000\nNoNewPrivs:\t1\n";

    #[test]
    fn a_hostile_name_is_not_a_field() {
        let s = parse(NOBODY).unwrap();
        assert_eq!((s.tgid, s.uid, s.frozen), (42, 65534, true));
        assert_eq!((s.creds.fsuid, s.creds.groups.len()), (65534, 2));
    }

    #[test]
    fn capabilities_or_mixed_ids_are_not_frozen() {
        let caps = String::from_utf8(NOBODY.to_vec())
            .unwrap()
            .replace("CapPrm:\t0000000000000000", "CapPrm:\t0000000000000400");
        assert!(!parse(caps.as_bytes()).unwrap().frozen);
        let mixed = String::from_utf8(NOBODY.to_vec()).unwrap().replace(
            "Uid:\t65534\t65534\t65534\t65534",
            "Uid:\t65534\t0\t65534\t65534",
        );
        assert!(!parse(mixed.as_bytes()).unwrap().frozen);
        assert!(!parse(mixed.as_bytes()).unwrap().fixed_until_exec);
        assert!(parse(b"Tgid:\t1\n").is_none());
    }

    #[test]
    fn without_no_new_privs_the_ids_are_fixed_only_until_an_exec() {
        let text = String::from_utf8(NOBODY.to_vec())
            .unwrap()
            .replace("NoNewPrivs:\t1", "NoNewPrivs:\t0")
            .replace("Uid:\t65534\t65534\t65534\t65534", "Uid:\t7\t7\t7\t7");
        let s = parse(text.as_bytes()).unwrap();
        assert_eq!((s.frozen, s.fixed_until_exec), (false, true));
        assert_eq!(s.ids, [7, 65534, 7, 65534, 7, 65534, 7, 65534]);
    }
}
