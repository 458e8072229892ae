//! Builds the tiny guest (images/tiny) and puts its ELF in OUT_DIR, so that the `ppa-vmm`
//! binary embeds it (`include_bytes!`) and `ppa-vmm demo` works from any directory.
//!
//! The guest is a member of this workspace; it is built by a nested `cargo build --release`
//! into its own target directory under OUT_DIR (a separate directory, so the outer build's
//! lock is never waited on), with the outer build's compiler wrappers and flags removed.
//!
//! It also passes the git commit of the source tree to the crate as `PPA_VMM_GIT_REVISION`
//! (the `revision` label of the `ppa_vmm_build_info` metric), when git can tell it.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Sets `PPA_VMM_GIT_REVISION` for the crate: the variable itself when the build environment
/// sets it (a source tarball), else `git rev-parse --short=12 HEAD`; nothing without either.
/// The script runs again when HEAD moves (a commit, a checkout).
fn git_revision(root: &Path) {
    println!("cargo:rerun-if-env-changed=PPA_VMM_GIT_REVISION");
    if let Ok(rev) = env::var("PPA_VMM_GIT_REVISION") {
        println!("cargo:rustc-env=PPA_VMM_GIT_REVISION={rev}");
        return;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git")
            .current_dir(root)
            .args(args)
            .output()
            .ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
    };
    let Some(rev) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return;
    };
    println!("cargo:rustc-env=PPA_VMM_GIT_REVISION={rev}");
    // HEAD, the branch it names, and packed-refs (where a branch may live instead).
    let mut watched = vec!["HEAD".to_string(), "packed-refs".to_string()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            let path = root.join(path);
            // A path that does not exist would make cargo run the script at every build.
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
}

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("set by cargo"));
    let root = manifest_dir
        .parent()
        .expect("vmm/ is inside the workspace")
        .to_path_buf();
    let out = PathBuf::from(env::var("OUT_DIR").expect("set by cargo"));
    let target_dir = out.join("tiny-target");
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".to_string());
    git_revision(&root);

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
