//! Any byte string given to the GGUF reader yields a value or a typed error:
//! never a panic, a hang, or an allocation out of proportion to the input.
//!
//! Run with `cargo fuzz run gguf_reader fuzz/seeds` (seeds: `tests/corpus/gguf`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = lamina_gguf::File::from_bytes(data.to_vec()) {
        // Every tensor view the reader hands out must be in bounds.
        for t in file.tensors() {
            let _ = file.tensor_data(t).len();
        }
        let _ = lamina_gguf::Model::from_shards(vec![file]);
    }
});
