//! The model's tokenizer, built from GGUF metadata (`tokenizer.ggml.*`).
//!
//! GPT-2 byte-level BPE (`tokenizer.ggml.model = gpt2`) with the model's
//! pre-tokenizer (`tokenizer.ggml.pre`, see [`pretokenize`]). Control and
//! user-defined tokens (token_type 3 and 4, e.g. `<|im_start|>`) are matched
//! as whole ids before BPE when the caller allows specials. Decoding maps the
//! byte stand-ins back to bytes, so `decode(encode(s)) == s` for every string.
//! Streaming detokenization for SSE lives in [`stream`].

mod bpe;
mod bpe_model;
mod cache;
pub mod pretokenize;
pub mod stream;

pub use bpe_model::{
    Tokenizer, TokenizerSpec, TOKEN_TYPE_CONTROL, TOKEN_TYPE_NORMAL, TOKEN_TYPE_USER_DEFINED,
};
pub use pretokenize::{PreTokenizer, PreTokenizerKind};
pub use stream::StreamDecoder;

#[cfg(test)]
pub(crate) use bpe_model::tests;
