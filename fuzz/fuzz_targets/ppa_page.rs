//! Fuzz target `ppa_page`: the properties are those of `ppa_vmm::fuzzing::ppa_page`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::ppa_page(data));
