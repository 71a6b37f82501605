//! Pre-tokenizers: split text into the pieces BPE runs on, per `tokenizer.ggml.pre`.
//!
//! GPT-2's split pattern is
//! `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
//! The `regex` crate has no look-ahead, so the pattern runs without the
//! `\s+(?!\S)` branch and a whitespace-only match is fixed up by hand: a run
//! of 2+ whitespace chars followed by more text gives back its last char (which
//! then prefixes the next word), exactly what the look-ahead branch does.
//! `smollm` (SmolLM/SmolLM2) first isolates every numeric char, then applies
//! the GPT-2 split with no prefix space — as llama.cpp's
//! `LLAMA_VOCAB_PRE_TYPE_SMOLLM` and HF's `Digits(individual) + ByteLevel`.

use regex::Regex;

use crate::EngineError;

const GPT2_PATTERN: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+";

/// Which pre-tokenizer a vocabulary uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PreTokenizerKind {
    /// GPT-2 byte-level split.
    Gpt2,
    /// Every `\p{N}` char alone, then the GPT-2 split (no prefix space).
    Smollm,
}

impl PreTokenizerKind {
    /// Map the GGUF `tokenizer.ggml.pre` value; `None` means plain GPT-2.
    pub fn from_gguf_name(name: Option<&str>) -> Result<PreTokenizerKind, EngineError> {
        match name {
            None | Some("default") | Some("gpt2") | Some("gpt-2") => Ok(PreTokenizerKind::Gpt2),
            Some("smollm") => Ok(PreTokenizerKind::Smollm),
            Some(other) => Err(EngineError::Model(format!(
                "unsupported pre-tokenizer `{other}` (supported: smollm, gpt2, default)"
            ))),
        }
    }
}

/// A compiled pre-tokenizer.
#[derive(Debug, Clone)]
pub struct PreTokenizer {
    kind: PreTokenizerKind,
    gpt2: Regex,
}

impl PreTokenizer {
    /// Compile the pre-tokenizer of `kind`.
    pub fn new(kind: PreTokenizerKind) -> Result<PreTokenizer, EngineError> {
        let gpt2 = Regex::new(GPT2_PATTERN).map_err(|e| EngineError::ModelPart {
            part: "pre-tokenizer pattern",
            source: e.into(),
        })?;
        Ok(PreTokenizer { kind, gpt2 })
    }

    /// The kind this pre-tokenizer implements.
    pub fn kind(&self) -> PreTokenizerKind {
        self.kind
    }

    /// Split `text` into pieces, calling `emit` for each in order. The pieces
    /// concatenate back to `text` exactly.
    pub fn split<'t>(&self, text: &'t str, emit: &mut impl FnMut(&'t str)) {
        match self.kind {
            PreTokenizerKind::Gpt2 => self.split_gpt2(text, emit),
            PreTokenizerKind::Smollm => {
                let mut start = 0;
                for (i, c) in text.char_indices() {
                    if c.is_numeric() {
                        self.split_gpt2(&text[start..i], emit);
                        let end = i + c.len_utf8();
                        emit(&text[i..end]);
                        start = end;
                    }
                }
                self.split_gpt2(&text[start..], emit);
            }
        }
    }

    fn split_gpt2<'t>(&self, text: &'t str, emit: &mut impl FnMut(&'t str)) {
        let mut pos = 0;
        while pos < text.len() {
            let Some(m) = self.gpt2.find_at(text, pos) else {
                // Every char matches some branch; this is only a safety net.
                emit(&text[pos..]);
                return;
            };
            if m.start() > pos {
                emit(&text[pos..m.start()]);
            }
            let mut end = m.end();
            let piece = m.as_str();
            if end < text.len() && piece.chars().all(char::is_whitespace) {
                // `\s+(?!\S)`: leave the last whitespace char for the next piece
                // when the run is followed by non-whitespace and is longer than one.
                if let Some((last, _)) = piece.char_indices().next_back() {
                    if last > 0 {
                        end = m.start() + last;
                    }
                }
            }
            emit(&text[pos.max(m.start())..end]);
            pos = end;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(kind: PreTokenizerKind, text: &str) -> Vec<String> {
        let p = PreTokenizer::new(kind).expect("pattern compiles");
        let mut out = Vec::new();
        p.split(text, &mut |s| out.push(s.to_string()));
        assert_eq!(out.concat(), text, "pieces must concatenate to the input");
        out
    }

    #[test]
    fn gpt2_split_matches_the_lookahead_pattern() {
        let k = PreTokenizerKind::Gpt2;
        assert_eq!(pieces(k, "Hello world"), ["Hello", " world"]);
        assert_eq!(pieces(k, "a   b"), ["a", "  ", " b"]);
        assert_eq!(pieces(k, "a\n b"), ["a", "\n", " b"]);
        assert_eq!(pieces(k, "a\n\nb"), ["a", "\n", "\n", "b"]);
        assert_eq!(pieces(k, "end  "), ["end", "  "]);
        assert_eq!(pieces(k, "don't"), ["don", "'t"]);
        assert_eq!(pieces(k, "x.'s"), ["x", ".'", "s"]);
        assert_eq!(pieces(k, "year 2024"), ["year", " 2024"]);
        assert_eq!(pieces(k, "  \t x"), ["  \t", " x"]);
        assert_eq!(pieces(k, "a !? b"), ["a", " !?", " b"]);
    }

    #[test]
    fn smollm_isolates_every_digit_and_adds_no_prefix_space() {
        let k = PreTokenizerKind::Smollm;
        assert_eq!(pieces(k, "Hello"), ["Hello"]);
        assert_eq!(
            pieces(k, "year 2024!"),
            ["year", " ", "2", "0", "2", "4", "!"]
        );
        assert_eq!(pieces(k, "x²3"), ["x", "²", "3"]);
        assert_eq!(pieces(k, ""), Vec::<String>::new());
    }

    #[test]
    fn unknown_pre_tokenizer_is_an_error() {
        assert!(PreTokenizerKind::from_gguf_name(Some("llama-bpe")).is_err());
        assert_eq!(
            PreTokenizerKind::from_gguf_name(Some("smollm")).ok(),
            Some(PreTokenizerKind::Smollm)
        );
    }
}
