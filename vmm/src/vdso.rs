//! The vDSO's own `clock_gettime`, found once in the image the kernel maps into every process,
//! so that the vCPU's exit path reads CLOCK_MONOTONIC without going through the C library.
//!
//! Why: the C library's `clock_gettime` reaches the vDSO through its own code and the dynamic
//! loader's data (`_rtld_global_ro`), two pages more than the vDSO's code and its data page.
//! On the PVM development host, which flushes the TLB at every exit, each page the exit path
//! touches costs a page walk through the nested host's paging (docs/design.md, "Where the gap
//! is"): the clock read just after an exit cost ~750 cycles through the C library.
//!
//! How: `getauxval(AT_SYSINFO_EHDR)` gives the image; its program headers give the dynamic
//! section, which gives the symbol table, the string table and the SysV hash table (whose
//! chain count is the number of symbols). `__vdso_clock_gettime` is looked up by name. Where
//! any of that is missing (no vDSO, no DT_HASH, no such symbol) [`MonoClock`] reads the clock
//! through the C library, as [`crate::sync::now_ns`] does: same clock, same values.

use std::ffi::CStr;
use std::sync::OnceLock;

/// The vDSO's `clock_gettime`.
type ClockGettime = unsafe extern "C" fn(libc::clockid_t, *mut libc::timespec) -> libc::c_int;

/// The most symbols a vDSO is believed to have; beyond that the image is not used.
const MAX_SYMBOLS: u64 = 1024;
/// The part of the image read before its size is known: its first page, which holds the ELF
/// and program headers.
const FIRST_PAGE: u64 = 4096;

/// ELF program header and dynamic entry types (elf.h).
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_HASH: u64 = 4;
const DT_STRTAB: u64 = 5;
const DT_SYMTAB: u64 = 6;

/// CLOCK_MONOTONIC read through the vDSO's entry point where there is one. A copy is a
/// function pointer, which a thread keeps with its loop: a read touches the vDSO's code and
/// data and nothing else of the process.
#[derive(Debug, Clone, Copy)]
pub struct MonoClock(Option<ClockGettime>);

impl MonoClock {
    /// The process's clock (the lookup is made once).
    pub fn get() -> MonoClock {
        static FOUND: OnceLock<Option<usize>> = OnceLock::new();
        // SAFETY: `lookup` reads the image the kernel mapped for the life of the process.
        let found = *FOUND.get_or_init(|| unsafe { lookup(c"__vdso_clock_gettime") });
        // SAFETY: the address is the vDSO's `clock_gettime`, whose C signature is
        // `ClockGettime` (include/vdso/gettime.h); the vDSO is never unmapped.
        MonoClock(found.map(|a| unsafe { std::mem::transmute::<usize, ClockGettime>(a) }))
    }

    /// Whether reads go through the vDSO's entry point (else through the C library).
    pub fn direct(self) -> bool {
        self.0.is_some()
    }

    /// Monotonic time in ns.
    #[inline]
    pub fn now_ns(self) -> u64 {
        let Some(f) = self.0 else {
            return crate::sync::now_ns();
        };
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `f` is the vDSO's clock_gettime (see `get`); `ts` is a valid, writable
        // timespec and CLOCK_MONOTONIC always exists.
        if unsafe { f(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
            return crate::sync::now_ns();
        }
        ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
    }
}

/// Reads a `T` at `base + off` when it lies wholly below `base + limit`.
///
/// # Safety
/// `base..base + limit` must be mapped and readable (the vDSO image, or its first page).
unsafe fn at<T: Copy>(base: usize, off: u64, limit: u64) -> Option<T> {
    let end = off.checked_add(std::mem::size_of::<T>() as u64)?;
    if end > limit {
        return None;
    }
    // SAFETY: `base + off .. base + end` lies inside the readable range the caller names; the
    // read is unaligned-safe.
    Some(unsafe { std::ptr::read_unaligned((base + off as usize) as *const T) })
}

/// Whether the NUL-terminated string at `base + off` is `name`, reading below `base + limit`.
///
/// # Safety
/// As [`at`].
unsafe fn names(base: usize, off: u64, limit: u64, name: &CStr) -> bool {
    let want = name.to_bytes_with_nul();
    for (i, &b) in want.iter().enumerate() {
        // SAFETY: `at` reads inside the range the caller names.
        if unsafe { at::<u8>(base, off + i as u64, limit) } != Some(b) {
            return false;
        }
    }
    true
}

/// The address of the vDSO's function `name`, if it has one.
///
/// # Safety
/// Reads the image the kernel maps at `AT_SYSINFO_EHDR`: its first page, then the extent its
/// first loadable segment gives (the kernel maps the whole image, rounded up to pages).
unsafe fn lookup(name: &CStr) -> Option<usize> {
    // SAFETY: getauxval has no preconditions.
    let base = unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } as usize;
    if base == 0 {
        return None;
    }
    // SAFETY: the ELF header lies in the image's first page, which is mapped.
    let eh: libc::Elf64_Ehdr = unsafe { at(base, 0, FIRST_PAGE)? };
    if eh.e_ident[..4] != *b"\x7fELF" || eh.e_ident[4] != 2 {
        return None;
    }
    let (mut load, mut dynamic) = (None, None);
    for i in 0..u64::from(eh.e_phnum).min(64) {
        let off = eh.e_phoff + i * u64::from(eh.e_phentsize);
        // SAFETY: read only inside the first page.
        let ph: libc::Elf64_Phdr = unsafe { at(base, off, FIRST_PAGE)? };
        match ph.p_type {
            PT_LOAD if load.is_none() => load = Some(ph),
            PT_DYNAMIC => dynamic = Some(ph),
            _ => {}
        }
    }
    let (load, dynamic) = (load?, dynamic?);
    // The image as mapped: its one loadable segment, from the file's start.
    let size = load.p_offset.checked_add(load.p_filesz)?;
    // Where a virtual address of the image lies, as an offset from `base`.
    let offset = |vaddr: u64| vaddr.checked_sub(load.p_vaddr)?.checked_add(load.p_offset);
    let (mut symtab, mut strtab, mut hash) = (None, None, None);
    for i in 0..64u64 {
        // An Elf64_Dyn: a tag and a value.
        // SAFETY: read only inside the mapped image.
        let [tag, value]: [u64; 2] = unsafe { at(base, dynamic.p_offset + i * 16, size)? };
        match tag {
            DT_NULL => break,
            DT_SYMTAB => symtab = offset(value),
            DT_STRTAB => strtab = offset(value),
            DT_HASH => hash = offset(value),
            _ => {}
        }
    }
    let (symtab, strtab, hash) = (symtab?, strtab?, hash?);
    // SAFETY: read only inside the mapped image.
    let nchain: u32 = unsafe { at(base, hash + 4, size)? };
    for i in 0..u64::from(nchain).min(MAX_SYMBOLS) {
        // SAFETY: read only inside the mapped image.
        let sym: libc::Elf64_Sym = unsafe { at(base, symtab + i * 24, size)? };
        // Defined (a section index), of type STT_FUNC.
        let function = sym.st_shndx != 0 && sym.st_info & 0xf == 2;
        // SAFETY: read only inside the mapped image.
        if function && unsafe { names(base, strtab + u64::from(sym.st_name), size, name) } {
            let at = offset(sym.st_value)?;
            return (at < size).then_some(base + at as usize);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vdso_clock_is_found_and_reads_the_c_librarys_clock() {
        let clock = MonoClock::get();
        // SAFETY: getauxval has no preconditions.
        if unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } != 0 {
            assert!(
                clock.direct(),
                "a process with a vDSO finds its clock_gettime"
            );
        }
        for _ in 0..1000 {
            let a = crate::sync::now_ns();
            let b = clock.now_ns();
            let c = crate::sync::now_ns();
            assert!(
                a <= b && b <= c,
                "{a} <= {b} <= {c}: one clock, read in order"
            );
        }
    }

    #[test]
    fn a_name_the_vdso_lacks_is_not_found() {
        // SAFETY: reads the process's own vDSO image.
        assert_eq!(unsafe { lookup(c"__vdso_no_such_call") }, None);
        // SAFETY: as above.
        let time = unsafe { lookup(c"__vdso_time") };
        // SAFETY: getauxval has no preconditions.
        if unsafe { libc::getauxval(libc::AT_SYSINFO_EHDR) } != 0 {
            assert!(time.is_some(), "x86_64's vDSO has time()");
        }
    }
}
