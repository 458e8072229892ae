//! The memory routines the compiler may call on its own (struct and array copies, zeroing;
//! unoptimised builds call them often). There is no libc, and core's `compiler_builtins`
//! provides them only on freestanding targets, so they are here. Each is a single
//! `rep movsb`/`rep stosb`, so the compiler cannot turn its body back into a call to itself.
//!
//! The direction flag is clear at every call (SysV ABI; the VMM starts the vCPU with it clear)
//! and clear again on return.

use core::arch::asm;

/// Copies `n` bytes from `src` to `dest`; returns `dest`.
///
/// # Safety
/// `src` must be valid for `n` bytes of reads, `dest` for `n` bytes of writes, and the two
/// ranges must not overlap.
#[no_mangle]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges are valid for `n` bytes; `rep movsb` with DF
    // clear reads [src, src+n) and writes [dest, dest+n) and nothing else, and clobbers only the
    // declared RCX/RSI/RDI.
    unsafe {
        asm!("rep movsb", inout("rcx") n => _, inout("rsi") src => _, inout("rdi") dest => _,
            options(nostack, preserves_flags));
    }
    dest
}

/// Copies `n` bytes from `src` to `dest`, which may overlap; returns `dest`.
///
/// # Safety
/// `src` must be valid for `n` bytes of reads and `dest` for `n` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // `dest` is below `src` or past its end: a forward copy never reads a byte it wrote.
        // SAFETY: the caller's guarantees, and a forward copy is correct for this overlap.
        return unsafe { memcpy(dest, src, n) };
    }
    // `dest` is inside (src, src+n): copy backwards, last byte first.
    // SAFETY: the caller guarantees both ranges are valid for `n` (> 0 here, as the difference
    // is below it) bytes; with DF set `rep movsb` walks from the last byte of each range down
    // to the first, touching only those ranges; DF is cleared again before returning.
    unsafe {
        asm!("std", "rep movsb", "cld",
            inout("rcx") n => _, inout("rsi") src.add(n - 1) => _, inout("rdi") dest.add(n - 1) => _,
            options(nostack));
    }
    dest
}

/// Fills `n` bytes at `dest` with the low byte of `c`; returns `dest`.
///
/// # Safety
/// `dest` must be valid for `n` bytes of writes.
#[no_mangle]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees `dest` is valid for `n` bytes; `rep stosb` with DF clear
    // writes [dest, dest+n) and nothing else, and clobbers only the declared RCX/RDI.
    unsafe {
        asm!("rep stosb", inout("rcx") n => _, inout("rdi") dest => _, in("al") c as u8,
            options(nostack, preserves_flags));
    }
    dest
}
