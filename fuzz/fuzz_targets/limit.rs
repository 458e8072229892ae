//! Fuzz target `limit`: the properties are those of `ppa_vmm::fuzzing::limit`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::limit(data));
