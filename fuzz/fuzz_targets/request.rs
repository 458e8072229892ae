//! Fuzz target `request`: the properties are those of `ppa_vmm::fuzzing::request`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::request(data));
