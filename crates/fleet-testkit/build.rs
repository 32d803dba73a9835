//! Sets the cfg `herdr_bin` when `HERDR_BIN` is set at build time: the tests that need a real
//! herdr then run (on the binary it names, read again when they run); without it they are
//! ignored, with the reason, rather than passed.

fn main() {
    println!("cargo::rerun-if-env-changed=HERDR_BIN");
    println!("cargo::rustc-check-cfg=cfg(herdr_bin)");
    if std::env::var_os("HERDR_BIN").is_some_and(|bin| !bin.is_empty()) {
        println!("cargo::rustc-cfg=herdr_bin");
    }
}
