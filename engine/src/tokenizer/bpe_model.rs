//! The [`Tokenizer`] itself: vocabulary, specials, encode (pre-tokenize,
//! specials, BPE through the piece cache) and decode. `mod.rs` says how the
//! pieces fit.

use std::collections::HashMap;

use aho_corasick::{AhoCorasick, MatchKind};

use super::bpe::{self, MergeTable};
use super::cache::{Lease, PieceCache};
use super::pretokenize::{PreTokenizer, PreTokenizerKind};
use crate::gguf::GgufFile;
use crate::EngineError;

/// GGUF `token_type` of a normal token.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// GGUF `token_type` of a control token (`<|im_end|>`).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// GGUF `token_type` of a user-defined token (matched verbatim like a control token).
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// Everything needed to build a [`Tokenizer`], independent of the file format.
#[derive(Debug, Clone, Default)]
pub struct TokenizerSpec {
    /// Token strings, index = id (byte-level stand-ins for normal tokens).
    pub tokens: Vec<String>,
    /// GGUF token types, index = id; empty = all normal.
    pub token_types: Vec<i32>,
    /// `"left right"` merge rules, highest priority first.
    pub merges: Vec<String>,
    /// The pre-tokenizer.
    pub pre: Option<PreTokenizerKind>,
    pub bos_id: Option<u32>,
    pub eos_id: Option<u32>,
    pub unknown_id: Option<u32>,
    /// Whether prompts start with BOS (`tokenizer.ggml.add_bos_token`).
    pub add_bos: bool,
}

/// A byte-level BPE tokenizer.
#[derive(Debug)]
pub struct Tokenizer {
    vocab: HashMap<String, u32>,
    /// Decoded bytes of every id.
    token_bytes: Vec<Box<[u8]>>,
    token_text: Vec<String>,
    /// Control / user-defined ids.
    special: Vec<bool>,
    merges: MergeTable,
    pre: PreTokenizer,
    /// Matches special-token text, longest first; None when there are none.
    special_matcher: Option<(AhoCorasick, Vec<u32>)>,
    bos_id: Option<u32>,
    eos_id: Option<u32>,
    unknown_id: u32,
    add_bos: bool,
    /// BPE ids of recent pieces, leased to one encode at a time; never waited for.
    cache: PieceCache,
}

impl Tokenizer {
    /// Build from the `tokenizer.ggml.*` metadata of a GGUF file.
    pub fn from_gguf(gguf: &GgufFile) -> Result<Tokenizer, EngineError> {
        match gguf.get_str("tokenizer.ggml.model") {
            Some("gpt2") => {}
            other => {
                return Err(EngineError::Model(format!(
                    "unsupported tokenizer model {other:?} (only byte-level BPE `gpt2`)"
                )))
            }
        }
        let tokens = gguf
            .get_str_array("tokenizer.ggml.tokens")
            .ok_or_else(|| EngineError::Model("missing tokenizer.ggml.tokens".into()))?;
        let merges = gguf
            .get_str_array("tokenizer.ggml.merges")
            .ok_or_else(|| EngineError::Model("missing tokenizer.ggml.merges".into()))?;
        let spec = TokenizerSpec {
            tokens: tokens.into_iter().map(str::to_owned).collect(),
            token_types: gguf
                .get_i32_array("tokenizer.ggml.token_type")
                .unwrap_or_default(),
            merges: merges.into_iter().map(str::to_owned).collect(),
            pre: Some(PreTokenizerKind::from_gguf_name(
                gguf.get_str("tokenizer.ggml.pre"),
            )?),
            bos_id: gguf.get_u32("tokenizer.ggml.bos_token_id"),
            eos_id: gguf.get_u32("tokenizer.ggml.eos_token_id"),
            unknown_id: gguf.get_u32("tokenizer.ggml.unknown_token_id"),
            add_bos: gguf
                .get_bool("tokenizer.ggml.add_bos_token")
                .unwrap_or(false),
        };
        Tokenizer::from_spec(spec)
    }

    /// Build from an explicit vocabulary.
    pub fn from_spec(spec: TokenizerSpec) -> Result<Tokenizer, EngineError> {
        let n = spec.tokens.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(EngineError::Model(format!("bad vocabulary size {n}")));
        }
        if !spec.token_types.is_empty() && spec.token_types.len() != n {
            return Err(EngineError::Model(format!(
                "token_type has {} entries for {n} tokens",
                spec.token_types.len()
            )));
        }
        for (name, id) in [
            ("bos", spec.bos_id),
            ("eos", spec.eos_id),
            ("unknown", spec.unknown_id),
        ] {
            if id.is_some_and(|id| id as usize >= n) {
                return Err(EngineError::Model(format!("{name} id out of range")));
            }
        }
        let char_to_byte = bpe::char_to_byte_map();
        let mut vocab = HashMap::with_capacity(n);
        let mut token_bytes = Vec::with_capacity(n);
        let mut special = Vec::with_capacity(n);
        let mut special_texts = Vec::new();
        let mut special_ids = Vec::new();
        for (id, text) in spec.tokens.iter().enumerate() {
            let ty = spec
                .token_types
                .get(id)
                .copied()
                .unwrap_or(TOKEN_TYPE_NORMAL);
            let is_special = ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED;
            // First id wins for duplicated strings, as in the reference tokenizers.
            vocab.entry(text.clone()).or_insert(id as u32);
            let bytes: Vec<u8> = if is_special {
                text.as_bytes().to_vec()
            } else {
                let mut out = Vec::with_capacity(text.len());
                for c in text.chars() {
                    match char_to_byte.get(&c) {
                        Some(&b) => out.push(b),
                        None => out.extend_from_slice(c.encode_utf8(&mut [0u8; 4]).as_bytes()),
                    }
                }
                out
            };
            token_bytes.push(bytes.into_boxed_slice());
            special.push(is_special);
            if is_special && !text.is_empty() {
                special_texts.push(text.clone());
                special_ids.push(id as u32);
            }
        }
        let special_matcher = if special_texts.is_empty() {
            None
        } else {
            let ac = AhoCorasick::builder()
                .match_kind(MatchKind::LeftmostLongest)
                .build(&special_texts)
                .map_err(|e| EngineError::ModelPart {
                    part: "special tokens",
                    source: e.into(),
                })?;
            Some((ac, special_ids))
        };
        let merges = MergeTable::new(&vocab, &spec.merges);
        let pre = PreTokenizer::new(spec.pre.unwrap_or(PreTokenizerKind::Gpt2))?;
        Ok(Tokenizer {
            vocab,
            token_bytes,
            token_text: spec.tokens,
            special,
            merges,
            pre,
            special_matcher,
            bos_id: spec.bos_id,
            eos_id: spec.eos_id,
            unknown_id: spec.unknown_id.unwrap_or(0),
            add_bos: spec.add_bos,
            cache: PieceCache::new(),
        })
    }

    /// Token ids of `text`. With `parse_special`, the text of a control token
    /// (e.g. `<|im_start|>`) becomes that single id; without, it is ordinary text.
    /// Never adds BOS (see [`Tokenizer::encode_prompt`]).
    pub fn encode(&self, text: &str, parse_special: bool) -> Vec<u32> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        let mut cache = self.cache.lease();
        match (&self.special_matcher, parse_special) {
            (Some((ac, ids)), true) => {
                let mut last = 0;
                for m in ac.find_iter(text) {
                    self.encode_plain(&text[last..m.start()], &mut cache, &mut out);
                    out.push(ids[m.pattern().as_usize()]);
                    last = m.end();
                }
                self.encode_plain(&text[last..], &mut cache, &mut out);
            }
            _ => self.encode_plain(text, &mut cache, &mut out),
        }
        out
    }

    /// A prompt's ids: BOS first when the model wants it, specials parsed.
    pub fn encode_prompt(&self, text: &str) -> Vec<u32> {
        let mut ids = Vec::new();
        if self.add_bos {
            if let Some(bos) = self.bos_id {
                ids.push(bos);
            }
        }
        ids.extend(self.encode(text, true));
        ids
    }

    fn encode_plain(&self, text: &str, cache: &mut Lease<'_>, out: &mut Vec<u32>) {
        self.pre.split(text, &mut |piece| {
            cache.encode(piece, out, |out| {
                self.merges
                    .encode_word(piece.as_bytes(), self.unknown_id, out)
            });
        });
    }

    /// The text of `ids`; specials appear as their text. Invalid UTF-8 (e.g. a
    /// cut multi-byte char) becomes U+FFFD; ids out of range are skipped.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(ids, false)).into_owned()
    }

    /// The raw bytes of `ids`, optionally leaving out control tokens.
    pub fn decode_bytes(&self, ids: &[u32], skip_special: bool) -> Vec<u8> {
        let mut out = Vec::new();
        for &id in ids {
            if skip_special && self.is_special(id) {
                continue;
            }
            if let Some(b) = self.token_bytes.get(id as usize) {
                out.extend_from_slice(b);
            }
        }
        out
    }

    /// The decoded bytes of one id (None if out of range).
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.token_bytes.get(id as usize).map(|b| &b[..])
    }

    /// The vocabulary string of one id (byte-level stand-ins, e.g. `ĠParis`).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.token_text.get(id as usize).map(String::as_str)
    }

    /// The id of a vocabulary string.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.get(text).copied()
    }

    /// Whether `id` is a control or user-defined token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of ids.
    pub fn vocab_size(&self) -> usize {
        self.token_text.len()
    }

    pub fn bos_id(&self) -> Option<u32> {
        self.bos_id
    }

    pub fn eos_id(&self) -> Option<u32> {
        self.eos_id
    }

    /// Whether prompts should start with BOS.
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizerKind {
        self.pre.kind()
    }

    /// Ids that end a generation: EOS plus the usual end-of-turn / end-of-text
    /// control tokens when the vocabulary has them, sorted and deduplicated.
    pub fn stop_token_ids(&self) -> Vec<u32> {
        let mut ids: Vec<u32> = self.eos_id.into_iter().collect();
        for name in ["<|im_end|>", "<|endoftext|>", "<|eot_id|>", "<|end|>"] {
            if let Some(id) = self.token_id(name).filter(|&id| self.is_special(id)) {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        ids.dedup();
        ids
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A tiny vocabulary: all 256 byte stand-ins, a few merges, two specials.
    pub(crate) fn tiny() -> Tokenizer {
        let table = bpe::byte_to_char_table();
        let mut tokens: Vec<String> = vec!["<|im_start|>".into(), "<|im_end|>".into()];
        tokens.extend(table.iter().map(|c| c.to_string()));
        let merges = ["h e", "l l", "he ll", "hell o", "Ġ w", "Ġw o"];
        for m in merges {
            tokens.push(m.replace(' ', ""));
        }
        let mut types = vec![TOKEN_TYPE_CONTROL; 2];
        types.resize(tokens.len(), TOKEN_TYPE_NORMAL);
        Tokenizer::from_spec(TokenizerSpec {
            tokens,
            token_types: types,
            merges: merges.iter().map(|s| s.to_string()).collect(),
            pre: Some(PreTokenizerKind::Smollm),
            bos_id: Some(0),
            eos_id: Some(1),
            unknown_id: None,
            add_bos: false,
        })
        .expect("tiny vocabulary is valid")
    }

    #[test]
    fn specials_are_single_ids_only_when_allowed() {
        let t = tiny();
        let hello = t.token_id("hello").expect("merged token");
        let with = t.encode("<|im_start|>hello<|im_end|>", true);
        assert_eq!(with, vec![0, hello, 1]);
        let without = t.encode("<|im_start|>hello<|im_end|>", false);
        assert!(without.len() > 3 && !without.contains(&0) && !without.contains(&1));
        assert_eq!(t.decode(&without), "<|im_start|>hello<|im_end|>");
        assert_eq!(t.decode(&with), "<|im_start|>hello<|im_end|>");
        assert_eq!(t.decode_bytes(&with, true), b"hello");
        assert_eq!(t.stop_token_ids(), vec![1]);
    }

    #[test]
    fn round_trip_is_exact_for_arbitrary_text() {
        let t = tiny();
        for s in [
            "hello wo 12 3",
            "  \n\t x",
            "é東🚀\u{0}\u{7f}",
            "<|im_start|",
            "",
        ] {
            assert_eq!(t.decode(&t.encode(s, true)), s);
            assert_eq!(t.decode(&t.encode(s, false)), s);
        }
    }

    #[test]
    fn bad_specs_are_rejected() {
        assert!(Tokenizer::from_spec(TokenizerSpec::default()).is_err());
        let spec = TokenizerSpec {
            tokens: vec!["a".into()],
            token_types: vec![1, 1],
            ..TokenizerSpec::default()
        };
        assert!(Tokenizer::from_spec(spec).is_err());
        let spec = TokenizerSpec {
            tokens: vec!["a".into()],
            eos_id: Some(5),
            ..TokenizerSpec::default()
        };
        assert!(Tokenizer::from_spec(spec).is_err());
    }

    /// Distinct texts with shared and unshared pieces (words, numbers, code).
    fn varied_texts(n: usize) -> Vec<String> {
        let words = [
            "hello", "world", "fn", "let", "x_1", "wo", "héllo", "東京", "\n\t", "  ",
        ];
        (0..n)
            .map(|i| {
                (0..200)
                    .map(|j| {
                        let k = (i * 7919 + j * 104_729) % 1000;
                        match k % 4 {
                            0 => format!("{} ", words[k % words.len()]),
                            1 => format!("id{k}{i} "),
                            2 => format!("({k}.{j}); "),
                            _ => format!("{}{} ", words[j % words.len()], k % 37),
                        }
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn concurrent_encodes_give_the_sequential_ids() {
        let texts = varied_texts(16);
        let sequential: Vec<Vec<u32>> = {
            let t = tiny();
            texts.iter().map(|s| t.encode(s, true)).collect()
        };
        let t = tiny();
        std::thread::scope(|scope| {
            for thread in 0..4 {
                let (t, texts, sequential) = (&t, &texts, &sequential);
                scope.spawn(move || {
                    // Each thread in its own order, so they race on the same pieces.
                    for round in 0..texts.len() * 2 {
                        let i = (round + thread * 5) % texts.len();
                        assert_eq!(t.encode(&texts[i], true), sequential[i], "text {i}");
                    }
                });
            }
        });
        assert!(t.cache.len() > 0, "the pieces were cached");
    }

    #[test]
    fn an_encode_never_waits_for_the_cache() {
        // While another thread holds every cache lock, an encode still completes
        // (computing what it cannot look up): no encode waits for another.
        let text = varied_texts(1).remove(0);
        let expected = tiny().encode(&text, true);
        let t = std::sync::Arc::new(tiny());
        let held = t.cache.hold_all();
        let (tx, rx) = std::sync::mpsc::channel();
        let encoder = t.clone();
        let sent = text.clone();
        std::thread::spawn(move || {
            let _ = tx.send(encoder.encode(&sent, true));
        });
        let got = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(held);
        let got = got.expect("the encode waited for the cache: no result within 10 s");
        assert_eq!(got, expected);
        assert_eq!(t.encode(&text, true), expected);
        assert_eq!(t.encode(&text, true), expected, "from the cache");
    }
}
