//! The launcher's command line, and CMD as it runs once fhmon serves it.
//!
//! ```text
//! fhmon-launch [launch] --socket PATH --share DIR [--user USER[:GROUP]] [--fail-open]
//!     [--virtiofsd-handles prefer|mandatory] [--virtiofsd-migration file-handles]
//!     [--registration-timeout SECONDS] -- CMD ...
//! fhmon-launch served-argv [the same options] -- CMD ...     (prints CMD as served, NUL-ended)
//! ```
//!
//! `fhmon launch` (monitor/commands/node.py) parses its own options with argparse, then runs
//! this with them; KubeVirt's injected container runs it directly.

/// Seconds fhmon may take to answer (and the probe to pass) by default.
pub const REGISTRATION_TIMEOUT: f64 = 30.0;
/// The same with --fail-open: a pod should not wait long for a monitor that is not there.
pub const FAIL_OPEN_TIMEOUT: f64 = 5.0;

/// How CMD runs (monitor/launcher.py's Options until the launcher was native).
#[derive(Debug, Clone, PartialEq)]
pub struct Options {
    /// whenever fhmon cannot serve CMD, exec it exactly as given after one stderr line
    pub fail_open: bool,
    /// once fhmon serves: --inode-file-handles=MODE for virtiofsd
    pub virtiofsd_handles: Option<&'static str>,
    /// once fhmon serves: a --migration-mode CMD has becomes file-handles
    pub migration_by_handle: bool,
    pub registration_timeout: f64,
}

/// What to do: launch, or print CMD as served (tests/unit/test_launcher_argv.py).
#[derive(Debug, Clone, PartialEq)]
pub enum Mode {
    Launch,
    ServedArgv,
    /// -h or --help: print USAGE
    Help,
}

/// What --help prints.
pub const USAGE: &str =
    "usage: fhmon-launch [launch] --socket PATH --share DIR [--user USER[:GROUP]]
                    [--fail-open] [--virtiofsd-handles {prefer,mandatory}]
                    [--virtiofsd-migration file-handles] [--registration-timeout SECONDS]
                    -- CMD ...

Run CMD under fhmon's handle filter, registered with the fhmon at --socket (the native
`fhmon launch`; see `fhmon launch --help` and docs/kubevirt.md, \"The launcher\").
";

#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    pub mode: Mode,
    pub socket: Vec<u8>,
    pub share: String,
    pub user: Option<String>,
    pub options: Options,
    pub argv: Vec<Vec<u8>>,
}

/// A usage error: the message, for "fhmon-launch: error: ..." and exit status 2.
#[derive(Debug, Clone, PartialEq)]
pub struct UsageError(pub String);

fn text(value: &[u8], option: &str) -> Result<String, UsageError> {
    String::from_utf8(value.to_vec())
        .map_err(|_| UsageError(format!("argument {option}: not valid UTF-8")))
}

/// Parse the arguments after the program name.
pub fn parse(args: &[Vec<u8>]) -> Result<Invocation, UsageError> {
    let mut mode = Mode::Launch;
    let mut rest = args;
    match rest.first().map(Vec::as_slice) {
        Some(b"launch") => rest = &rest[1..],
        Some(b"served-argv") => {
            mode = Mode::ServedArgv;
            rest = &rest[1..];
        }
        _ => {}
    }
    let mut socket: Option<Vec<u8>> = None;
    let mut share: Option<String> = None;
    let mut user: Option<String> = None;
    let mut fail_open = false;
    let mut handles: Option<&'static str> = None;
    let mut migration = false;
    let mut timeout: Option<f64> = None;
    let mut i = 0;
    while i < rest.len() {
        let arg = &rest[i];
        i += 1;
        if arg.as_slice() == b"--" || !arg.starts_with(b"-") {
            if arg.as_slice() != b"--" {
                i -= 1; // CMD starts here (argparse's REMAINDER)
            }
            break;
        }
        let (name, inline) = match arg.iter().position(|&b| b == b'=') {
            Some(at) if arg.starts_with(b"--") => (&arg[..at], Some(arg[at + 1..].to_vec())),
            _ => (arg.as_slice(), None),
        };
        let name_text = String::from_utf8_lossy(name).into_owned();
        if name == b"-h" || name == b"--help" {
            mode = Mode::Help;
            continue;
        }
        if name == b"--fail-open" {
            if inline.is_some() {
                return Err(UsageError(
                    "argument --fail-open: ignored explicit argument".into(),
                ));
            }
            fail_open = true;
            continue;
        }
        let known: [&[u8]; 6] = [
            b"--socket",
            b"--share",
            b"--user",
            b"--virtiofsd-handles",
            b"--virtiofsd-migration",
            b"--registration-timeout",
        ];
        if !known.contains(&name) {
            return Err(UsageError(format!("unrecognized arguments: {name_text}")));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let Some(v) = rest.get(i) else {
                    return Err(UsageError(format!(
                        "argument {name_text}: expected one argument"
                    )));
                };
                i += 1;
                v.clone()
            }
        };
        match name {
            b"--socket" => socket = Some(value),
            b"--share" => share = Some(text(&value, "--share")?),
            b"--user" => user = Some(text(&value, "--user")?),
            b"--virtiofsd-handles" => {
                handles = Some(match value.as_slice() {
                    b"prefer" => "prefer",
                    b"mandatory" => "mandatory",
                    _ => {
                        return Err(UsageError(format!(
                            "argument --virtiofsd-handles: invalid choice: '{}' (choose from \
                             'prefer', 'mandatory')",
                            String::from_utf8_lossy(&value)
                        )));
                    }
                })
            }
            b"--virtiofsd-migration" => {
                if value.as_slice() != b"file-handles" {
                    return Err(UsageError(format!(
                        "argument --virtiofsd-migration: invalid choice: '{}' (choose from \
                         'file-handles')",
                        String::from_utf8_lossy(&value)
                    )));
                }
                migration = true;
            }
            _ => {
                let shown = String::from_utf8_lossy(&value).into_owned();
                let parsed: f64 = shown.trim().parse().map_err(|_| {
                    UsageError(format!(
                        "argument --registration-timeout: invalid float value: '{shown}'"
                    ))
                })?;
                timeout = Some(parsed);
            }
        }
    }
    let argv = rest[i..].to_vec();
    let share = match (share, &mode) {
        (Some(s), _) => s,
        (None, Mode::ServedArgv | Mode::Help) => String::new(),
        (None, Mode::Launch) => {
            return Err(UsageError(
                "the following arguments are required: --share".into(),
            ));
        }
    };
    let socket = match (socket, &mode) {
        (Some(s), _) => s,
        (None, Mode::ServedArgv | Mode::Help) => Vec::new(),
        (None, Mode::Launch) => {
            return Err(UsageError(
                "the following arguments are required: --socket".into(),
            ));
        }
    };
    let registration_timeout = timeout.unwrap_or(if fail_open {
        FAIL_OPEN_TIMEOUT
    } else {
        REGISTRATION_TIMEOUT
    });
    Ok(Invocation {
        mode,
        socket,
        share,
        user,
        options: Options {
            fail_open,
            virtiofsd_handles: handles,
            migration_by_handle: migration,
            registration_timeout,
        },
        argv,
    })
}

/// CMD as it runs when fhmon serves it: virtiofsd's handle flags per `options`.
///
/// --inode-file-handles goes last (before a "--", if any), not right after argv[0]: CMD
/// may be virtiofsd behind a loader or wrapper (`ld.so --library-path DIR virtiofsd ...`)
/// whose own options come first.
pub fn served_argv(argv: &[Vec<u8>], options: &Options) -> Vec<Vec<u8>> {
    if options.virtiofsd_handles.is_none() && !options.migration_by_handle {
        return argv.to_vec();
    }
    let mut out: Vec<Vec<u8>> = argv.iter().take(1).cloned().collect();
    let mut rest: Vec<Vec<u8>> = Vec::new();
    let mut i = 1;
    while i < argv.len() {
        let arg = &argv[i];
        i += 1;
        if arg.as_slice() == b"--" {
            rest = argv[i - 1..].to_vec();
            break;
        }
        let is = |flag: &[u8]| {
            arg.as_slice() == flag || (arg.starts_with(flag) && arg.get(flag.len()) == Some(&b'='))
        };
        if options.virtiofsd_handles.is_some() && is(b"--inode-file-handles") {
            if !arg.contains(&b'=') {
                i += 1; // its value
            }
            continue;
        }
        if options.migration_by_handle && is(b"--migration-mode") {
            // Only where CMD already asks for a mode: a virtiofsd without migration
            // support would refuse the flag.
            if !arg.contains(&b'=') {
                i += 1;
            }
            out.push(b"--migration-mode=file-handles".to_vec());
            continue;
        }
        out.push(arg.clone());
    }
    if let Some(mode) = options.virtiofsd_handles {
        out.push(format!("--inode-file-handles={mode}").into_bytes());
    }
    out.extend(rest);
    out
}

/// A number of seconds as Python's `{:g}` shows the usual ones (1 -> "1", 0.5 -> "0.5").
pub fn seconds(value: f64) -> String {
    format!("{value}")
}
