//! The GGUF reader on arbitrary bytes: it must return (accept or refuse), never panic, and an
//! accepted file's tensors must lie inside it.
#![no_main]
use libfuzzer_sys::fuzz_target;
use strata_host::gguf::GgufFile;

fuzz_target!(|data: &[u8]| {
    if let Ok(f) = GgufFile::from_bytes(data.to_vec(), "fuzz.gguf") {
        for t in &f.tensors {
            assert!(t.offset + t.bytes <= data.len() as u64);
            assert_eq!(f.data(t).len() as u64, t.bytes);
        }
    }
});
