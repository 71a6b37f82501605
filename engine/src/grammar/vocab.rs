//! The engine's vocabulary as llguidance's token trie ([`TokEnv`]).
//!
//! llguidance computes a token mask by walking a trie of every token's
//! bytes against the grammar's lexer, so it needs the bytes each id
//! decodes to: normal tokens give their decoded bytes (the byte-level BPE
//! stand-ins mapped back), control and user-defined tokens (`<|im_end|>`)
//! are marked with toktrie's special-token byte so no grammar can spell
//! them as text. The ids that end a generation (the tokenizer's stop ids)
//! are the trie's EOS set: a grammar that may end allows all of them.

use std::sync::Arc;

use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

use crate::tokenizer::Tokenizer;

/// The tokenizer and the trie built from its vocabulary.
struct EngineTokEnv {
    tokenizer: Arc<Tokenizer>,
    trie: TokTrie,
}

impl TokenizerEnv for EngineTokEnv {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    /// llguidance tokenizes grammar literals (forced prefixes) with this;
    /// bytes that are not UTF-8 fall back to the trie's greedy split.
    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        match std::str::from_utf8(s) {
            Ok(text) => self.tokenizer.encode(text, false),
            Err(_) => self.trie.greedy_tokenize(s),
        }
    }
}

/// Build the token trie of `tokenizer`'s vocabulary; `stop` are the ids
/// that end a generation.
pub(super) fn tok_env(tokenizer: Arc<Tokenizer>, stop: &[u32]) -> TokEnv {
    let n = tokenizer.vocab_size();
    let words: Vec<Vec<u8>> = (0..n as u32)
        .map(|id| match tokenizer.token_bytes(id) {
            Some(b) if tokenizer.is_special(id) => {
                let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                w.extend_from_slice(b);
                w
            }
            Some(b) => b.to_vec(),
            None => Vec::new(),
        })
        .collect();
    let eos = stop.first().copied().or(tokenizer.eos_id()).unwrap_or(0);
    let mut info = TokRxInfo::new(n as u32, eos);
    info.tok_bos = tokenizer.bos_id();
    let mut trie = TokTrie::from(&info, &words);
    if !stop.is_empty() {
        trie = trie.with_eos_tokens(stop);
    }
    Arc::new(EngineTokEnv { tokenizer, trie })
}
