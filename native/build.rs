//! Compiles protocol/refusals.toml, the one table of refusals both data planes read, into
//! `$OUT_DIR/refusals.rs` (included by src/refusals.rs): a const `Entry` per refusal and
//! `ALL`. The table's format is the small subset its header describes, read by hand here
//! (no parser crate); anything else in it stops the build with the line it is on.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

const TABLE: &str = "../protocol/refusals.toml";

#[derive(Default)]
struct Refusal {
    line: usize,
    strings: BTreeMap<String, String>,
    lists: BTreeMap<String, Vec<String>>,
    parts: Vec<String>,
    counted: Option<bool>,
}

fn main() {
    println!("cargo:rerun-if-changed={TABLE}");
    println!("cargo:rerun-if-changed=build.rs");
    let text = std::fs::read_to_string(TABLE).unwrap_or_else(|e| panic!("{TABLE}: {e}"));
    let (refusals, strerror) = parse(&text);
    let out = Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("refusals.rs");
    std::fs::write(&out, generate(&refusals, &strerror))
        .unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}

fn fail(line: usize, what: &str) -> ! {
    panic!("{TABLE}:{line}: {what}")
}

/// `[[refusal]]` entries and the `[strerror]` table.
fn parse(text: &str) -> (Vec<Refusal>, BTreeMap<String, String>) {
    enum Section {
        None,
        Refusal,
        Strerror,
    }
    let mut section = Section::None;
    let mut refusals: Vec<Refusal> = Vec::new();
    let mut strerror = BTreeMap::new();
    for (index, raw) in text.lines().enumerate() {
        let line = index + 1;
        let trimmed = raw.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        match trimmed {
            "[[refusal]]" => {
                section = Section::Refusal;
                refusals.push(Refusal {
                    line,
                    ..Refusal::default()
                });
                continue;
            }
            "[strerror]" => {
                section = Section::Strerror;
                continue;
            }
            _ if trimmed.starts_with('[') => fail(line, "unknown table"),
            _ => {}
        }
        let Some((key, value)) = trimmed.split_once('=') else {
            fail(line, "expected key = value");
        };
        let (key, value) = (key.trim(), value.trim());
        if !key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            fail(line, "bad key");
        }
        match section {
            Section::None => fail(line, "a key outside any table"),
            Section::Strerror => {
                if strerror
                    .insert(key.to_owned(), string(value, line))
                    .is_some()
                {
                    fail(line, "key given twice");
                }
            }
            Section::Refusal => {
                let entry = refusals.last_mut().expect("in a [[refusal]]");
                if let Some(name) = key.strip_prefix("part.") {
                    string(value, line); // a description, for people
                    entry.parts.push(name.to_owned());
                } else if key == "counted" {
                    entry.counted = Some(match value {
                        "true" => true,
                        "false" => false,
                        _ => fail(line, "counted is true or false"),
                    });
                } else if value.starts_with('[') {
                    let list = list(value, line);
                    if entry.lists.insert(key.to_owned(), list).is_some() {
                        fail(line, "key given twice");
                    }
                } else if entry
                    .strings
                    .insert(key.to_owned(), string(value, line))
                    .is_some()
                {
                    fail(line, "key given twice");
                }
            }
        }
    }
    (refusals, strerror)
}

/// A basic string on one line: "...", with \" and \\ as its only escapes.
fn string(value: &str, line: usize) -> String {
    let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) else {
        fail(line, "expected a \"string\"");
    };
    let mut out = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(e @ ('"' | '\\')) => out.push(e),
                _ => fail(line, "only \\\" and \\\\ are escapes here"),
            },
            '"' => fail(line, "an unescaped \" inside a string"),
            _ => out.push(c),
        }
    }
    out
}

/// ["A", "B"] on one line.
fn list(value: &str, line: usize) -> Vec<String> {
    let Some(inner) = value.strip_prefix('[').and_then(|v| v.strip_suffix(']')) else {
        fail(line, "expected [\"A\", ...] on one line");
    };
    inner
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| string(item, line))
        .collect()
}

fn errno_name(name: &str, line: usize) -> &str {
    if !(name.starts_with('E')
        && name
            .chars()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()))
    {
        fail(line, "errno is an errno's name (EACCES)");
    }
    name // an unknown name fails to compile as libc::NAME
}

fn generate(refusals: &[Refusal], strerror: &BTreeMap<String, String>) -> String {
    let mut out = String::from("// @generated by native/build.rs from protocol/refusals.toml\n");
    let mut names = Vec::new();
    for entry in refusals {
        let line = entry.line;
        let known = ["code", "errno", "reason", "strerror_otherwise"];
        if let Some(key) = entry.strings.keys().find(|k| !known.contains(&k.as_str())) {
            fail(line, &format!("unknown key {key}"));
        }
        if let Some(key) = entry.lists.keys().find(|k| k.as_str() != "strerror") {
            fail(line, &format!("unknown key {key}"));
        }
        let get = |key: &str| {
            entry
                .strings
                .get(key)
                .unwrap_or_else(|| fail(line, &format!("no {key}")))
        };
        let (code, errno, reason) = (get("code"), errno_name(get("errno"), line), get("reason"));
        if !code
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        {
            fail(line, "code is snake_case");
        }
        let mut texts = Vec::new();
        let mut otherwise = String::from("\"\"");
        if entry.parts.iter().any(|p| p == "strerror") {
            let listed = entry
                .lists
                .get("strerror")
                .unwrap_or_else(|| fail(line, "a {strerror} part needs strerror = [...]"));
            let text_of = |name: &str| {
                let detail = strerror
                    .get(name)
                    .unwrap_or_else(|| fail(line, &format!("no [strerror] text of {name}")));
                reason.replace("{strerror}", detail)
            };
            for name in listed {
                texts.push(format!(
                    "(libc::{}, {:?})",
                    errno_name(name, line),
                    text_of(name)
                ));
            }
            otherwise = format!("{:?}", text_of(get("strerror_otherwise")));
        }
        let name = code.to_uppercase();
        let counted = entry.counted.unwrap_or(true);
        let parts: Vec<String> = entry.parts.iter().map(|p| format!("{p:?}")).collect();
        writeln!(
            out,
            "/// {reason}\npub const {name}: Entry = Entry {{\n    code: {code:?},\n    \
             errno: libc::{errno},\n    errno_name: {errno:?},\n    reason: {reason:?},\n    \
             parts: &[{}],\n    counted: {counted},\n    strerror: &[{}],\n    \
             strerror_otherwise: {otherwise},\n}};",
            parts.join(", "),
            texts.join(", "),
        )
        .expect("write to a String");
        names.push(name);
    }
    writeln!(
        out,
        "/// Every refusal of the table, in its order.\npub const ALL: [Entry; {}] = [{}];",
        names.len(),
        names.join(", ")
    )
    .expect("write to a String");
    out
}
