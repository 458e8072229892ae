//! Fuzz target `http_head`: the properties are those of `ppa_vmm::fuzzing::http_head`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ppa_vmm::fuzzing::http_head(data));
