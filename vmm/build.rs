//! Builds the tiny guest (images/tiny) and puts its ELF in OUT_DIR, so that the `ppa-vmm`
//! binary embeds it (`include_bytes!`) and `ppa-vmm demo` works from any directory.
//!
//! The guest is a member of this workspace; it is built by a nested `cargo build --release`
//! into its own target directory under OUT_DIR (a separate directory, so the outer build's
//! lock is never waited on), with the outer build's compiler wrappers and flags removed.

use std::env;
use std::path::PathBuf;
use std::process::Command;

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("vmm/ is inside the workspace")
        .to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    let target_dir = out.join("tiny-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());

    for dir in [
        "images/tiny/src",
        "images/tiny/Cargo.toml",
        "images/tiny/build.rs",
        "ppa-guest-abi/src",
    ] {
        println!("cargo:rerun-if-changed={}", root.join(dir).display());
    }

    let status = Command::new(cargo)
        .current_dir(&root)
        .args([
            "build",
            "--release",
            "--quiet",
            "-p",
            "ppa-tiny-guest",
            "--target-dir",
        ])
        .arg(&target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS")
        .env_remove("RUSTC_WORKSPACE_WRAPPER")
        .env_remove("RUSTC_WRAPPER")
        .env_remove("CARGO_TARGET_DIR")
        .env_remove("CARGO_BUILD_TARGET")
        .status()
        .expect("cannot run cargo to build the tiny guest");
    assert!(
        status.success(),
        "building the tiny guest (images/tiny) failed"
    );

    let elf = target_dir.join("release").join("ppa-tiny-guest");
    std::fs::copy(&elf, out.join("tiny.elf")).expect("the tiny guest ELF was not produced");
}
