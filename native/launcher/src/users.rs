//! --user USER[:GROUP]: names or ids, names looked up in /etc/passwd and /etc/group (the
//! launcher is static: no NSS modules), as monitor/launcher.py's parse_user did.

/// One field of the line of `table` (passwd or group format) whose first field is `name`.
fn lookup<'a>(table: &'a str, name: &str, field: usize) -> Option<&'a str> {
    table
        .lines()
        .map(|line| line.split(':').collect::<Vec<_>>())
        .find(|fields| fields.len() > field && fields[0] == name)
        .map(|fields| fields[field])
}

fn number(text: &str) -> Option<u32> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    text.parse().ok()
}

/// (uid, gid) for `spec` given the text of /etc/passwd and /etc/group; the error is the
/// message for the operator.
pub fn parse_user(spec: &str, passwd: &str, group: &str) -> Result<(u32, u32), String> {
    let (name, group_name) = match spec.split_once(':') {
        Some((n, g)) => (n, Some(g)),
        None => (spec, None),
    };
    let uid = match number(name) {
        Some(uid) => uid,
        None if name.bytes().all(|b| b.is_ascii_digit()) && !name.is_empty() => {
            return Err(format!("user id {name} is out of range"));
        }
        None => lookup(passwd, name, 2)
            .and_then(number)
            .ok_or_else(|| format!("no user '{name}'"))?,
    };
    let gid = match group_name.filter(|g| !g.is_empty()) {
        Some(g) => match number(g) {
            Some(gid) => gid,
            None => lookup(group, g, 2)
                .and_then(number)
                .ok_or_else(|| format!("no group '{g}'"))?,
        },
        None => passwd
            .lines()
            .map(|line| line.split(':').collect::<Vec<_>>())
            .find(|f| f.len() > 3 && number(f[2]) == Some(uid))
            .and_then(|f| number(f[3]))
            .unwrap_or(uid),
    };
    Ok((uid, gid))
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\nqemu:x:107:107::/:/bin/false\n\
                          nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n";
    const GROUP: &str = "root:x:0:\nkvm:x:36:qemu\nnogroup:x:65534:\n";

    #[test]
    fn names_and_ids() {
        assert_eq!(parse_user("65534", PASSWD, GROUP), Ok((65534, 65534)));
        assert_eq!(parse_user("qemu", PASSWD, GROUP), Ok((107, 107)));
        assert_eq!(parse_user("qemu:kvm", PASSWD, GROUP), Ok((107, 36)));
        assert_eq!(parse_user("4242", PASSWD, GROUP), Ok((4242, 4242)));
        assert_eq!(parse_user("107:0", PASSWD, GROUP), Ok((107, 0)));
        assert_eq!(
            parse_user("ghost", PASSWD, GROUP),
            Err("no user 'ghost'".into())
        );
        assert_eq!(
            parse_user("0:ghost", PASSWD, GROUP),
            Err("no group 'ghost'".into())
        );
    }
}
