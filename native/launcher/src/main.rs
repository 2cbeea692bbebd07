//! `fhmon-launch`: see the library (src/lib.rs) and docs/kubevirt.md, "The launcher".

use std::os::unix::ffi::OsStringExt;

fn main() {
    let args: Vec<Vec<u8>> = std::env::args_os()
        .skip(1)
        .map(OsStringExt::into_vec)
        .collect();
    std::process::exit(fhmon_launch::run::main_with(&args));
}
