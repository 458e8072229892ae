//! Link settings of the tiny guest.
//!
//! The guest is built for the host target but must come out as a freestanding, static,
//! non-PIE ELF executable: no C runtime start files, no libc, no dynamic section or program
//! interpreter, and every PT_LOAD segment at or above 1 MiB (the VMM loads segments at their
//! physical addresses, identity mapped). `--build-id=none` drops the note so the image is
//! reproducible and has no segment the VMM does not need.

fn main() {
    for arg in [
        "-nostartfiles",
        "-nostdlib",
        "-static",
        "-no-pie",
        "-Wl,--image-base=0x100000",
        "-Wl,--build-id=none",
    ] {
        println!("cargo:rustc-link-arg-bins={arg}");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
